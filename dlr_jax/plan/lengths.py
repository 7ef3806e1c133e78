"""The sequence lengths of a stage's configured data, measured once and cached, for the planner's padded and
packed stage totals (`dlr_jax.plan.cli`).

A stage's rows are `data.max_len` tokens whether they hold one example (padded) or several (packed,
`data.packing`), so a step costs the same either way (but for sft's dual branch, whose packed row computes one OCR
row per segment slot: `plan.totals.packed_ocr_step`) and the totals differ in how many steps an epoch takes. That
needs the lengths of the stage's sequences (`data.items.build_sequence`): the configured training split (a
seeded sample of at most `SAMPLE` examples; the paper's GSM8K-Aug train split is 385,620; where its file is missing,
the stand-in the readers read in its place, named in the notes: `data.readers.STAND_INS`), tokenised as the run
would (`tokenizer.path` / `init_from`'s tokenizer; else the workdir's; else a BPE trained as the run trains one),
with the run's latent counts per example (latent.source=random / step_results: as the stage draws them; codebook:
the workdir's exported ids, else each CoT's canvas at the codebook's mean font size, N = (side / 64)^2, which is
what the codebook stage's rendering gives at that size). Under sft's latent curriculum (`latent.curriculum`) an
example's length is its longest row: the text CoT behind an empty span, or the whole span (the extremes of its
mixed rows; the pipeline's own filter, `data.items.fitting_items`, measures every k).

The lengths are cached as JSON under `$DLR_CACHE_DIR/lengths` (default `~/.cache/dlr_jax/lengths`), keyed by
everything above that decides them (the data and tokenizer settings, the files read and their sizes and times);
`python -m dlr_jax.plan --refresh-lengths` measures again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.config import Config, to_dict
from dlr_jax.data.items import STAGES  # the stages whose rows are tokens

SAMPLE = 20_000
VERSION = 3  # 2: a pretrained tokenizer's note names its file's digest; 3: a stand-in split is named


def cache_dir() -> Path:
    """`$DLR_CACHE_DIR/lengths`, default `$XDG_CACHE_HOME/dlr_jax/lengths` (`~/.cache/dlr_jax/lengths`)."""
    root = os.environ.get("DLR_CACHE_DIR")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlr_jax"
    return Path(root) / "lengths"


@dataclasses.dataclass(frozen=True)
class Lengths:
    """`lengths`: one per measured example (a sample of `population`); `notes`: how they were measured."""

    stage: str
    lengths: tuple[int, ...]
    population: int
    notes: tuple[str, ...]
    path: str  # the cache file
    cached: bool  # read from the cache, not measured now

    def summary(self, max_len: int) -> dict[str, Any]:
        x = np.asarray(self.lengths)
        return {"lengths_measured": int(x.size), "lengths_population": self.population,
                "length_mean": float(x.mean()), "length_p50": float(np.percentile(x, 50)),
                "length_p95": float(np.percentile(x, 95)), "length_max": int(x.max()),
                "longer_than_max_len": int((x > max_len).sum()), "lengths_cache": self.path,
                "lengths_notes": list(self.notes)}


def _stat(path: Path) -> list[Any] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [str(path), st.st_size, st.st_mtime_ns]


def _workdir_file(cfg: Config, *parts: str) -> Path:
    return Path(cfg.run.workdir).joinpath(*parts)


def _tokenizer_source(cfg: Config) -> tuple[str, Path | None]:
    from dlr_jax.text.tokens import TOKENIZER_FILE

    d = cfg.tokenizer.path or cfg.init_from
    if d and (Path(d) / TOKENIZER_FILE).is_file():
        return "pretrained", Path(d) / TOKENIZER_FILE
    f = _workdir_file(cfg, "tokenizer", TOKENIZER_FILE)
    if f.is_file():
        return "workdir", f
    return "bpe", None


def _latents_file(cfg: Config) -> Path | None:
    from dlr_jax.data.latents import latents_path

    if cfg.latent.source != "codebook":
        return None
    f = latents_path(cfg.run.workdir, cfg.data.train_split)
    return f if f.is_file() else None


def cache_key(cfg: Config, stage: str, sample: int) -> str:
    data = to_dict(cfg.data)
    for k in ("pack", "pack_batch", "num_workers", "max_len"):  # how rows are filled, not what the sequences are
        data.pop(k, None)
    kind, tok_file = _tokenizer_source(cfg)
    key: dict[str, Any] = {"v": VERSION, "stage": stage, "sample": sample, "seed": cfg.run.seed, "data": data,
                           "data_file": _stat(Path(cfg.data.path)) if cfg.data.path else None,
                           "data_dir": os.environ.get("DLR_DATA_DIR"), "tokenizer": to_dict(cfg.tokenizer),
                           "tokenizer_kind": kind, "tokenizer_file": _stat(tok_file) if tok_file else None,
                           "num_latents": cfg.latent.num_latents, "latent_source": cfg.latent.source}
    if stage == "sft" and cfg.latent.curriculum != "off":
        key["curriculum"] = cfg.latent.curriculum
    if stage != "textsft" and cfg.latent.source == "codebook":
        lat = _latents_file(cfg)
        key["latents_file"] = _stat(lat) if lat else None
        cb = cfg.codebook
        key["render"] = [cb.font_mean, cb.font_min, cb.font_max, cb.min_side, cb.max_side, cb.overflow,
                         cb.render_view]
        if cb.render_unit != "chain":  # so a chain run's cached lengths stay valid
            key["render"].append(cb.render_unit)
    blob = json.dumps(key, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def file_digest(path: Path) -> str:
    """"<name> sha256 <first 16 hex digits>": which file it was, whatever folder it was read from."""
    return f"{path.name} sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"


def _tokenizer(cfg: Config, kind: str, examples: list) -> tuple[Any, str]:
    from dlr_jax.stages import common
    from dlr_jax.text.tokens import TOKENIZER_FILE, Tokenizer

    if kind == "pretrained":
        d = cfg.tokenizer.path or cfg.init_from
        return common.pretrained_tokenizer(cfg), f"tokenizer of {d} ({file_digest(Path(d) / TOKENIZER_FILE)})"
    if kind == "workdir":
        return Tokenizer.load(_workdir_file(cfg, "tokenizer")), f"the tokenizer of {cfg.run.workdir}"
    with tempfile.TemporaryDirectory() as tmp:  # the BPE a from-scratch run trains on its training split
        tok = common.get_tokenizer(cfg, tmp, examples)
    return tok, f"a {cfg.tokenizer.vocab_size}-token BPE trained on the training split, as a run trains one"


def _latent_counts(cfg: Config, examples: list) -> tuple[list[int], str]:
    from dlr_jax.data.cot_view import render_texts, step_results
    from dlr_jax.data.latents import default_num_latents, read_latents

    src = cfg.latent.source
    if src == "random":
        return [default_num_latents(ex) for ex in examples], "latent counts as latent.source=random draws them"
    if src == "step_results":
        return [len(step_results(ex.cot)) for ex in examples], "one latent per CoT step (latent.source=step_results)"
    f = _latents_file(cfg)
    if f is not None:
        table = read_latents(f, num_codes=cfg.latent.num_latents)
        missing = [ex.id for ex in examples if ex.id not in table]
        if not missing:
            return [len(table[ex.id]) for ex in examples], f"latent counts of {f}"
    from dlr_jax.data.render_pipeline import canvas_side, render_config
    from dlr_jax.text.render import PATCH

    rcfg, cb = render_config(cfg.codebook), cfg.codebook
    size = int(np.rint(np.clip(cb.font_mean, cb.font_min, cb.font_max)))
    # one canvas a CoT, or one a step of it (codebook.render_unit=step: an example's latents are its steps' codes)
    sides = [[canvas_side(t, size, rcfg)[0] for t in render_texts(ex.cot, cb.render_view, cb.render_unit,
                                                                   example_id=ex.id)] for ex in examples]
    return [sum((s // PATCH) ** 2 for s in ss) for ss in sides], (
        f"latent counts estimated: each CoT's canvas{'es' if cb.render_unit == 'step' else ''} at {size} px "
        "(no exported latent ids in the workdir)")


def measure(cfg: Config, stage: str, sample: int = SAMPLE) -> tuple[list[int], int, list[str]]:
    """(lengths of a seeded sample of the stage's sequences, examples in the split, notes); reads the data."""
    from dlr_jax.data.items import Item, build_sequence
    from dlr_jax.data.readers import stand_in_read
    from dlr_jax.data.sources import load_examples

    if stage not in STAGES:
        raise ValueError(f"no sequence lengths for stage {stage!r}; stages with rows of tokens: {STAGES}")
    examples = load_examples(cfg, cfg.data.train_split)
    population = len(examples)
    kind, _ = _tokenizer_source(cfg)
    tok, tok_note = _tokenizer(cfg, kind, examples)
    if len(examples) > sample:
        pick = np.sort(np.random.default_rng(cfg.run.seed).choice(len(examples), sample, replace=False))
        examples = [examples[i] for i in pick]
    counts, lat_note = _latent_counts(cfg, examples) if stage != "textsft" else ([0] * len(examples), "")
    variants: tuple[int | None, ...] = (0, 1) if stage == "sft" and cfg.latent.curriculum != "off" else (None,)
    lengths = [max(len(build_sequence(stage, tok, Item(ex, (0,) * n, (n,), k))) for k in variants)
               for ex, n in zip(examples, counts, strict=True)]
    what = f"a sample of {len(examples):,}" if population > len(examples) else "all"
    read = f"{cfg.data.dataset}:{cfg.data.train_split}"
    stand_in = stand_in_read(cfg.data.dataset, cfg.data.train_split, examples)
    if stand_in is not None:  # the full split's file is missing: its rows are the stand-in's, scaled to its size
        read = (f"{cfg.data.dataset}:{stand_in}, standing in for {cfg.data.train_split} (whose file is not here: "
                "data.readers.STAND_INS)")
    notes = [f"{stage} sequences of the {population:,} examples read from {read} ({what}), {tok_note}"]
    return lengths, population, notes + ([lat_note] if lat_note else [])


def stage_lengths(cfg: Config, stage: str, *, sample: int = SAMPLE, refresh: bool = False) -> Lengths:
    """The stage's measured lengths, from the cache when it holds them (measured and cached otherwise)."""
    path = cache_dir() / f"{stage}-{cache_key(cfg, stage, sample)}.json"
    if path.is_file() and not refresh:
        try:
            d = json.loads(path.read_text())
            return Lengths(stage, tuple(d["lengths"]), d["population"], tuple(d["notes"]), str(path), True)
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file is measured again
    lengths, population, notes = measure(cfg, stage, sample)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"stage": stage, "population": population, "notes": notes, "lengths": lengths}))
    tmp.replace(path)
    return Lengths(stage, tuple(lengths), population, tuple(notes), str(path), False)
