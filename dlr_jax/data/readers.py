"""The benchmark registry: `load_benchmark(name, path=None, split=None) -> list[Example]`.

| name       | splits (default first)                | files under the data root                  |
|------------|---------------------------------------|--------------------------------------------|
| gsm8k      | test, train                           | gsm8k/{test,train}.jsonl                   |
| gsm8k_aug  | test, valid, train, train_subset_3000 | gsm8k_aug/<split>.txt                      |
| gsm_hard   | test                                  | gsm_hard/gsmhardv2.jsonl                   |
| svamp      | test (all 1,000)                      | svamp/SVAMP.json                           |
| multiarith | all (600), test (180), train (420)    | multiarith/MultiArith.json                 |
| math500    | test                                  | math500/test.jsonl                         |
| math_train | train                                 | math_train/train.jsonl                     |
| mathx_5m   | train (a corpus source only)          | mathx_5m/data/*.parquet (a folder)         |
| synthetic  | test, valid, train                    | generated (or `path`/<split>.txt)          |
| synthetic_hard, synthetic_reworded | test, valid   | generated: GSM-Hard's / SVAMP's analogue   |

`path` may be a file in the benchmark's format (user-supplied copy; `split` then only names the
ids) or a directory laid out like the benchmark's folder. GSM8K-Aug "train" is the full 385,620-line
`train.txt` when present; otherwise the 3,000-line subset is used and a warning says so.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from dlr_jax.data import synthetic, synthetic_variants
from dlr_jax.data.checks import check_not_empty, check_numeric_golds
from dlr_jax.data.gsm8k import read_gsm8k
from dlr_jax.data.gsm8k_aug import read_gsm8k_aug
from dlr_jax.data.gsm_hard import read_gsm_hard
from dlr_jax.data.hendrycks_math import read_math
from dlr_jax.data.mathx import read_mathx
from dlr_jax.data.multiarith import read_multiarith
from dlr_jax.data.paths import shared_data_dir
from dlr_jax.data.records import DataFormatError, Example
from dlr_jax.data.svamp import read_svamp

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
    """subdir: folder under the data root; files: split -> file name; counts: split -> records in
    the public release (checked by the downloader, not by `load_benchmark`, since user copies may
    legitimately differ). folder: a split is a folder of files (MathX-5M's parquet shards); its reader
    also takes `sample=n, seed=s` and draws a stratified sample while reading."""

    name: str
    subdir: str
    files: Mapping[str, str]
    counts: Mapping[str, int]
    read: Callable[..., list[Example]]
    folder: bool = False

    @property
    def default_split(self) -> str:
        return next(iter(self.files))

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.files)


def _read_math_train(path: Path, *, split: str = "train", **kw: Any) -> list[Example]:
    return read_math(path, split=split, source="math_train", **kw)


BENCHMARKS: Mapping[str, BenchmarkSpec] = {
    s.name: s
    for s in (
        BenchmarkSpec(
            "gsm8k",
            "gsm8k",
            {"test": "test.jsonl", "train": "train.jsonl"},
            {"test": 1319, "train": 7473},
            read_gsm8k,
        ),
        BenchmarkSpec(
            "gsm8k_aug",
            "gsm8k_aug",
            {
                "test": "test.txt",
                "valid": "valid.txt",
                "train": "train.txt",
                "train_subset_3000": "train_subset_3000.txt",
            },
            {"test": 1319, "valid": 500, "train": 385620, "train_subset_3000": 3000},
            read_gsm8k_aug,
        ),
        BenchmarkSpec("gsm_hard", "gsm_hard", {"test": "gsmhardv2.jsonl"}, {"test": 1319}, read_gsm_hard),
        BenchmarkSpec("svamp", "svamp", {"test": "SVAMP.json"}, {"test": 1000}, read_svamp),
        BenchmarkSpec(
            "multiarith",
            "multiarith",
            {"all": "MultiArith.json", "test": "MultiArith.json", "train": "MultiArith.json"},
            {"all": 600, "test": 180, "train": 420},
            read_multiarith,
        ),
        BenchmarkSpec("math500", "math500", {"test": "test.jsonl"}, {"test": 500}, read_math),
        BenchmarkSpec(
            "math_train", "math_train", {"train": "train.jsonl"}, {"train": 12000}, _read_math_train
        ),
        # counts: none on record (the card's size is not checked here); the paper samples 603K of it
        BenchmarkSpec("mathx_5m", "mathx_5m", {"train": "data"}, {}, read_mathx, folder=True),
    )
}
# (benchmark, split) -> the split read in its place when its file is missing: GSM8K-Aug's full train set
# (385,620 lines) is a separate download; the 3,000-line subset ships with the benchmark's folder
STAND_INS: Mapping[tuple[str, str], str] = {("gsm8k_aug", "train"): "train_subset_3000"}
SYNTHETIC = "synthetic"
# SYNTHETIC_VARIANTS: generated, evaluation-only variants of it (GSM-Hard's and SVAMP's analogues).
SYNTHETIC_VARIANTS = synthetic_variants.VARIANTS
SYNTHETIC_FAMILY = (SYNTHETIC, *SYNTHETIC_VARIANTS)
NAMES: tuple[str, ...] = (*BENCHMARKS, *SYNTHETIC_FAMILY)


def benchmark_file(name: str, split: str | None = None, path: str | Path | None = None) -> Path:
    """The file `load_benchmark(name, path, split)` would read (synthetic and its variants: only with a path)."""
    if name in SYNTHETIC_FAMILY:
        if path is None:
            raise ValueError(f"{name} data has no file unless `path` is given")
        p = Path(path)
        return p / f"{split or 'test'}.txt" if p.is_dir() else p
    spec = _spec(name)
    split = split or spec.default_split
    if split not in spec.files:
        raise ValueError(f"{name}: unknown split {split!r}; known: {spec.splits}")
    if path is not None and not Path(path).is_dir():
        return Path(path)
    folder = Path(path) if path is not None else shared_data_dir() / spec.subdir
    f = folder / spec.files[split]
    if (name, split) in STAND_INS and not f.exists():
        subset = folder / spec.files[STAND_INS[name, split]]
        if subset.exists():
            warnings.warn(
                f"{f} not found (the full GSM8K-Aug train set is 385,620 lines; get it with "
                f"`python -m dlr_jax.data.download gsm8k_aug_full`); using the 3,000-line subset "
                f"{subset}",
                stacklevel=3,
            )
            return subset
    return f


def load_benchmark(
    name: str, path: str | Path | None = None, split: str | None = None, **options: Any
) -> list[Example]:
    """Reads one benchmark split as `Example`s.

    name: one of NAMES. path: None (the data root), a directory laid out like the benchmark's
    folder, or a single file in the benchmark's format. split: None -> the benchmark's default.
    options: passed to the reader, e.g. `cot="natural"` for gsm8k; for synthetic `seed`, `sizes`,
    `config` (see `dlr_jax.data.synthetic.synthetic_splits`).
    """
    if name in SYNTHETIC_FAMILY:
        return _load_synthetic(name, path, split or "test", **options)
    spec = _spec(name)
    split = split or spec.default_split
    f = benchmark_file(name, split, path)
    if not spec.folder:
        _check_not_a_directory(f, name, split)
    if not (f.exists() if spec.folder else f.is_file()):
        raise FileNotFoundError(
            f"{name} ({split}): {f} does not exist; "
            f"get it with `python -m dlr_jax.data.download {name} --to DIR` "
            "and set $DLR_DATA_DIR=DIR (or pass `--data-dir DIR` to evaluate, `path=` in Python)"
        )
    stand_in = STAND_INS.get((name, split))
    if stand_in is not None and f.name == spec.files[stand_in]:
        split = stand_in  # ids say what was actually read (stand_in_read)
    return _checked(spec.read(f, split=split, **options), name, f)


def stand_in_read(name: str, split: str, examples: Iterable[Example]) -> str | None:
    """The split that `load_benchmark(name, split=split)` read in place of `split` (STAND_INS: GSM8K-Aug's
    3,000-line subset when the full train set is missing), as the examples' ids name it; None when the
    examples are `split`'s own."""
    stand_in = STAND_INS.get((name, split))
    ids = [ex.id for ex in examples]
    if stand_in is None or not ids or not all(i.startswith(f"{name}/{stand_in}/") for i in ids):
        return None
    return stand_in


def _check_not_a_directory(f: Path, name: str, split: str) -> None:
    """A directory where the data file is expected (a copy unpacked one level too deep): one line (DataFormatError,
    exit 2) saying so, instead of a traceback that the file "does not exist"."""
    if f.is_dir():
        raise DataFormatError(f, f"is a directory; {name} ({split}) reads a file here")


def _checked(examples: list[Example], name: str, f: Path) -> list[Example]:
    """No empty files; numeric golds where scoring is numeric (dlr_jax/data/checks.py)."""
    check_not_empty(examples, f)
    check_numeric_golds(examples, name, f)
    return examples


def _load_synthetic(name: str, path: str | Path | None, split: str, **options: Any) -> list[Example]:
    if path is not None:
        f = benchmark_file(name, split, path)
        _check_not_a_directory(f, name, split)
        return _checked(read_gsm8k_aug(f, split=split, source=name), name, f)
    if name != SYNTHETIC:
        return synthetic_variants.variant_split(name, split, **options)
    if split not in synthetic.SPLIT_ORDER:
        raise ValueError(f"synthetic: unknown split {split!r}; known: {synthetic.SPLIT_ORDER}")
    return synthetic.synthetic_splits(options.pop("sizes", None), only=[split], **options)[split]


def _spec(name: str) -> BenchmarkSpec:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {NAMES}")
    return BENCHMARKS[name]


def filter_examples(
    examples: Iterable[Example], keep: Callable[[Example], bool], *, reason: str
) -> tuple[list[Example], int]:
    """(kept, number dropped); the count is also logged with `reason`, so no filter is silent."""
    examples = list(examples)
    kept = [ex for ex in examples if keep(ex)]
    dropped = len(examples) - len(kept)
    log.info("dropped %d of %d examples: %s", dropped, len(examples), reason)
    return kept, dropped
