"""Latent id sequences per example: `<workdir>/latents/<split>.jsonl` and the in-memory table.

One JSON object per line, written by the export stage:

    {"id": "gsm8k_aug/train/17", "latents": [812, 5, 9377, 41], "n": 4,
     "question": "...", "cot": "...", "answer": "...", "source": "gsm8k_aug", "extra": {...}}

`latents` are code indices k in [0, K) (rows of the codebook), not vocabulary ids: the vocabulary
offset belongs to the tokenizer (`Tokenizer.latent_id(k)`), so a file stays valid when the text
vocabulary changes. `n == len(latents)`. The record fields (question ... extra) are optional on
read; when present, the table also carries the examples, so the align / sft stages can train from
the latents file alone.

A codebook that renders one step a canvas (`codebook.render_unit=step`) writes each example's latents as
its steps' codes in order and adds `"steps": [c_1, c_2, ...]`, the codes of each step (sum == n), in the
order of `text.steps.split_steps(cot)` (under a results view, of its steps that hold a calculator step).
Without the field an example is one step of n codes: `LatentTable.step_counts(id)` reads either.

`random_latents` is a stand-in for tests and for running align / sft before a codebook exists:
each example gets a deterministic pseudo-random id sequence. It carries no information about the
CoT, so a model trained on it learns nothing about reasoning from the latents.

`step_result_latents` is the opposite control, a perfect codebook: one code per calculator step
`<<a+b=c>>` of the CoT, holding its result c. It is not the paper's method (no image, no codebook);
it measures what the language-model side of DLR can do when the latents do carry the chain.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.core.files import atomic_path
from dlr_jax.data.cot_view import step_results
from dlr_jax.data.records import DataFormatError, Example, iter_jsonl, require
from dlr_jax.text.render import PATCH
from dlr_jax.text.steps import split_steps

LATENTS_DIR = "latents"
RECORD_FIELDS = ("question", "cot", "answer", "source", "extra")


def latents_path(workdir: str | os.PathLike, split: str) -> Path:
    """`<workdir>/latents/<split>.jsonl` (a "name:split" split, another benchmark's, as name-split.jsonl)."""
    return Path(workdir) / LATENTS_DIR / f"{split.replace(':', '-')}.jsonl"


class LatentTable(Mapping[str, tuple[int, ...]]):
    """Example id -> latent code indices (a read-only mapping), plus the examples when known.

    num_codes: K when known; every code is checked to lie in [0, K).
    steps: example id -> codes of each of its steps (positive, summing to its n); an id not in it is one
    step of all its codes.
    """

    def __init__(
        self,
        latents: Mapping[str, Sequence[int]],
        *,
        examples: Mapping[str, Example] | None = None,
        num_codes: int | None = None,
        steps: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self._latents = {str(k): tuple(int(c) for c in v) for k, v in latents.items()}
        self._examples = dict(examples or {})
        self.num_codes = num_codes
        self._steps = {str(k): tuple(int(c) for c in v) for k, v in (steps or {}).items()}
        for k, v in self._steps.items():
            problem = step_count_problem(v, len(self._latents[k]) if k in self._latents else None)
            if problem:
                raise ValueError(f"example {k!r}: {problem}")
        if num_codes is not None:
            for k, v in self._latents.items():
                bad = [c for c in v if not 0 <= c < num_codes]
                if bad:
                    raise ValueError(f"example {k!r}: latent codes {bad[:5]} outside [0, {num_codes})")
        unknown = set(self._examples) - set(self._latents)
        if unknown:
            raise ValueError(f"examples without latents: {sorted(unknown)[:5]} ({len(unknown)} in all)")

    def __getitem__(self, key: str) -> tuple[int, ...]:
        try:
            return self._latents[key]
        except KeyError:
            raise KeyError(f"no latents for example id {key!r} ({len(self)} ids in the table)") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._latents)

    def __len__(self) -> int:
        return len(self._latents)

    def step_counts(self, key: str) -> tuple[int, ...]:
        """The codes of each step of `key`'s latents, in order (sum == n); `(n,)` when the file recorded no steps
        (a codebook that renders whole chains: one step)."""
        return self._steps.get(key) or (len(self[key]),)

    def example(self, key: str) -> Example:
        """The source record stored with `key` (KeyError when the file had none)."""
        if key not in self._examples:
            raise KeyError(f"no source record stored for example id {key!r}")
        return self._examples[key]

    def examples(self) -> list[Example]:
        """The stored source records, in table order."""
        return [self._examples[k] for k in self._latents if k in self._examples]

    def lengths(self) -> np.ndarray:
        """int64 [len(self)]: n per example, in table order."""
        return np.fromiter((len(v) for v in self._latents.values()), dtype=np.int64, count=len(self))

    def missing(self, examples: Iterable[Example]) -> list[str]:
        """Ids of `examples` that have no latents here."""
        return [ex.id for ex in examples if ex.id not in self._latents]

    def __repr__(self) -> str:
        lens = self.lengths()
        span = f", n in [{lens.min()}, {lens.max()}]" if len(lens) else ""
        return f"LatentTable({len(self)} ids, num_codes={self.num_codes}{span})"


def step_count_problem(counts: Sequence[int], n: int | None) -> str | None:
    """What is wrong with `counts` as the codes per step of n latents (None when nothing is; n None: an example
    that has no latents)."""
    if n is None:
        return "step counts for an example without latents"
    if not counts or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts):
        return f"'steps' should be a non-empty list of positive ints, got {list(counts)!r:.80}"
    if sum(counts) != n:
        return f"'steps' {list(counts)!r:.80} sum to {sum(counts)} but 'latents' has {n} codes"
    return None


def write_latents(
    path: str | os.PathLike,
    examples: Iterable[Example],
    latents: Mapping[str, Sequence[int]],
    steps: Mapping[str, Sequence[int]] | None = None,
) -> Path:
    """Writes one line per example (in the given order): id, latents, n, steps (the codes of each step, when
    `steps` has the id) and the record fields."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(p) as tmp, open(tmp, "w", encoding="utf-8") as f:  # a crash leaves no half file
        for ex in examples:
            codes = [int(c) for c in latents[ex.id]]
            rec: dict[str, Any] = {"id": ex.id, "latents": codes, "n": len(codes)}
            if steps is not None and ex.id in steps:
                counts = [int(c) for c in steps[ex.id]]
                problem = step_count_problem(counts, len(codes))
                if problem:
                    raise ValueError(f"example {ex.id!r}: {problem}")
                rec["steps"] = counts
            rec |= {k: v for k, v in ex.to_dict().items() if k != "id"}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return p


def read_latents(path: str | os.PathLike, *, num_codes: int | None = None) -> LatentTable:
    """Reads `write_latents` output. A malformed line raises `DataFormatError` naming file:line."""
    p = Path(path)
    if p.is_dir():
        raise DataFormatError(p, "is a directory; expected the export stage's latent ids file (JSON lines)")
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist (written by the export stage, or use random_latents)")
    latents: dict[str, tuple[int, ...]] = {}
    examples: dict[str, Example] = {}
    steps: dict[str, list[int]] = {}
    first_line: dict[str, int] = {}
    for lineno, obj in iter_jsonl(p, raw_floats=False):
        key = require(obj, "id", str, p, line=lineno)
        if key in first_line:
            raise DataFormatError(p, f"duplicate id {key!r} (first on line {first_line[key]})", line=lineno)
        codes = require(obj, "latents", list, p, line=lineno)
        if not codes or not all(isinstance(c, int) and not isinstance(c, bool) for c in codes):
            raise DataFormatError(
                p, f"field 'latents' should be a non-empty list of ints, got {codes!r:.80}", line=lineno
            )
        if num_codes is not None and not all(0 <= c < num_codes for c in codes):
            bad = [c for c in codes if not 0 <= c < num_codes]
            raise DataFormatError(p, f"latent codes {bad[:5]} outside [0, num_codes={num_codes})", line=lineno)
        if "n" in obj and obj["n"] != len(codes):
            raise DataFormatError(p, f"'n' is {obj['n']!r} but 'latents' has {len(codes)} codes", line=lineno)
        if "steps" in obj:
            counts = obj["steps"]
            problem = step_count_problem(counts if isinstance(counts, list) else [], len(codes))
            if problem:
                raise DataFormatError(p, problem if isinstance(counts, list) else
                                      f"field 'steps' should be a list of ints, got {counts!r:.80}", line=lineno)
            steps[key] = counts
        if "question" in obj:
            for field in ("question", "answer"):
                require(obj, field, str, p, line=lineno)
            if not isinstance(obj.get("extra", {}), dict):
                raise DataFormatError(p, f"field 'extra' should be an object, got {obj['extra']!r:.80}", line=lineno)
            examples[key] = Example.from_dict(obj)
        latents[key] = tuple(codes)
        first_line[key] = lineno
    return LatentTable(latents, examples=examples, num_codes=num_codes, steps=steps)


def default_num_latents(example: Example, *, short_chars: int = 40) -> int:
    """4 for a CoT of at most `short_chars` characters, else 9: the two canvas sizes (128 / 192 px)
    that short GSM8K-style CoTs render to (`text.render`: N = (L/64)^2)."""
    return 4 if len(example.cot) <= short_chars else 9


def _stable_seed(seed: int, key: str) -> int:
    # Python's hash() is salted per process; grain workers and other hosts must agree.
    return int.from_bytes(hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest(), "little")


def random_latents(
    examples: Iterable[Example],
    num_codes: int,
    seed: int = 0,
    n_fn: Callable[[Example], int] = default_num_latents,
) -> LatentTable:
    """A placeholder table: example id -> n_fn(example) codes drawn uniformly from [0, num_codes).

    Deterministic per (seed, id), independent of order and of the other examples. For tests and
    for exercising align / sft before a codebook exists; the codes carry no CoT information.
    """
    if num_codes < 1:
        raise ValueError(f"num_codes must be >= 1, got {num_codes}")
    latents: dict[str, list[int]] = {}
    examples_by_id: dict[str, Example] = {}
    for ex in examples:
        n = int(n_fn(ex))
        if n < 1:
            raise ValueError(f"n_fn returned {n} for example {ex.id!r}; need >= 1")
        rng = np.random.default_rng(_stable_seed(seed, ex.id))
        latents[ex.id] = rng.integers(0, num_codes, size=n).tolist()
        examples_by_id[ex.id] = ex
    return LatentTable(latents, examples=examples_by_id, num_codes=num_codes)


def step_result_code(value: str, num_codes: int) -> int:
    """A step result as a code: an integer in [0, num_codes) is its own code; anything else (large,
    negative, fractional) is hashed into the range, so distinct results can share a code."""
    text = value.replace(",", "").strip()
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and number.is_integer() and 0 <= number < num_codes:
        return int(number)
    return _stable_seed(0, text) % num_codes


def step_result_latents(examples: Iterable[Example], num_codes: int) -> LatentTable:
    """example id -> one code per `<<...=c>>` step of its CoT, holding c (`step_result_code`). CoTs
    need calculator annotations (synthetic, GSM8K-Aug): a CoT without any is an error, not a code for its
    answer, which would hand the answer to the model. See the module docstring: a control.

    Each code is its own step (`step_counts` (1,) * n) where the CoT's text steps (`split_steps`) are its n
    calculator steps one to one, as an equations chain's are, so the latent curriculum sees S = n steps; a natural
    chain (sentences, some without a calculator step) stays one step of n codes, as code i would otherwise be
    paired with a sentence that does not hold result i."""
    if num_codes < 1:
        raise ValueError(f"num_codes must be >= 1, got {num_codes}")
    latents: dict[str, list[int]] = {}
    steps: dict[str, tuple[int, ...]] = {}
    examples_by_id: dict[str, Example] = {}
    for ex in examples:
        results = step_results(ex.cot)
        if not results:
            raise ValueError(f"latent.source=step_results: example {ex.id!r} has no calculator step <<a+b=c>> in its "
                             f"CoT {ex.cot[:80]!r}; this control needs annotated CoTs (synthetic, gsm8k_aug)")
        latents[ex.id] = [step_result_code(r, num_codes) for r in results]
        text_steps = split_steps(ex.cot)
        if len(text_steps) == len(results) and all(len(step_results(s)) == 1 for s in text_steps):
            steps[ex.id] = (1,) * len(results)
        examples_by_id[ex.id] = ex
    return LatentTable(latents, examples=examples_by_id, num_codes=num_codes, steps=steps)


def fixed_step_codes(cb: Any) -> int | None:
    """The codes every step's canvas gives when a codebook renders one step a canvas (`codebook.render_unit=step`):
    (side / 64)^2 when codebook.min_side = max_side fixes the canvas, else None (a step's codes then depend on
    its text, which a generated run of codes does not carry, so it cannot be cut into steps). `cb`: a
    `CodebookConfig`."""
    if cb.min_side != cb.max_side:
        return None
    return (cb.min_side // PATCH) ** 2


def cut_steps(codes: Sequence[int], per_step: int) -> list[list[int]]:
    """`codes` cut into groups of `per_step` codes, in order (the last one shorter when the run is not a whole
    number of steps): a generated latent span as the steps a fixed-canvas step codebook would have encoded."""
    if per_step < 1:
        raise ValueError(f"per_step must be >= 1, got {per_step}")
    return [[int(c) for c in codes[i:i + per_step]] for i in range(0, len(codes), per_step)]
