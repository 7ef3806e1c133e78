"""grain pipelines that render CoTs into image batches for the codebook and export stages.

Every image in a batch has the same canvas side L, so the encoder sees a fixed N = (L/64)^2 per
batch and each side compiles once. Sides are known before drawing: `canvas_side` runs the
renderer's layout without drawing (far cheaper than drawing), so batches are planned up front and only
the drawing happens in the grain workers.

Training (`make_render_dataset`), as the paper renders each CoT once:

    every example gets one font size (Gaussian, clipped, rounded: `render.sample_font_size`
    semantics, seeded) -> its side -> buckets by side.
    epoch e: each bucket is shuffled (seed, e) and cut into full batches, the leftover < batch_size
    examples of a bucket sit that epoch out (different ones each epoch; counted in `PlanStats`);
    the batch order is shuffled too.
    grain: MapDataset.range(batches_per_epoch).repeat().map_with_index(render the batch)
      -> to_iter_dataset (reader threads) -> optional mp_prefetch(num_workers).

Each element is a whole batch, so the grain iterator state is just a position: `get_state` /
`set_state` resume exactly, and the batches do not depend on num_workers. Multi-process: the plan is
global and identical on every process (same seed); process i takes rows [i*b, (i+1)*b) of each
batch, so all processes agree on L at every step.

A batch (numpy):  images  uint8 [b, L, L] (grey; the model repeats it to RGB on the device)
                  targets int32 [b, T_L]  (`ocr_text.encode_target`: chars, <eos>, <pad>)
                  index   int32 [b]       (position of the example in the input list)
T_L is the 99th percentile of bucket L's target lengths rounded up to 16 (at most max_text_len);
longer targets are cut and counted (`PlanStats.text_cut`).

Evaluation / export (`fixed_batches` + `make_fixed_dataset`): the mean font size for everyone
(deterministic), every example exactly once, the last batch of each side may be short.

Worker processes: everything given to grain is a top-level function or a `functools.partial` of
picklable objects; scripts that set num_workers > 0 need an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from dlr_jax.data.stage_data import prefetch, read_options
from dlr_jax.text import render
from dlr_jax.text.ocr_text import encode_target, normalize_text

log = logging.getLogger(__name__)


def render_config(cb: Any) -> render.RenderConfig:
    """`RenderConfig` from a `config.CodebookConfig`."""
    return render.RenderConfig(
        font_mean=cb.font_mean, font_std=cb.font_std, font_min=cb.font_min, font_max=cb.font_max,
        min_side=cb.min_side, max_side=cb.max_side, overflow=cb.overflow,
    )


def cot_pieces(text: str, max_chars: int) -> list[str]:
    """`text` cut into consecutive pieces of whole words, each at most `max_chars` characters (a word
    longer than that is a piece of its own, whole). Joining the pieces with single spaces gives back
    the text with its whitespace runs collapsed."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    pieces: list[str] = []
    cur = ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > max_chars:
            pieces.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        pieces.append(cur)
    return pieces


def canvas_side(text: str, font_size: int, config: render.RenderConfig) -> tuple[int, bool, bool]:
    """(side, shrunk, truncated) that `render.render_cot_ex(text, font_size=..)` gives, without drawing."""
    path = config.font_path or render.default_font_path()
    found = render.fit_layout(render.split_paragraphs(text), font_size, config, path)
    if found is not None:
        return found[0], False, False
    if config.overflow == "shrink":
        for size in range(font_size - 1, config.min_font_size - 1, -1):
            found = render.fit_layout(render.split_paragraphs(text), size, config, path)
            if found is not None:
                return found[0], True, False
    return config.max_side, config.overflow == "shrink", True


def sample_font_sizes(n: int, seed: int, config: render.RenderConfig) -> np.ndarray:
    """n font sizes with `render.sample_font_size`'s distribution, from one seeded generator."""
    x = np.random.default_rng(seed).normal(config.font_mean, config.font_std, n)
    return np.rint(np.clip(x, config.font_min, config.font_max)).astype(np.int32)


@dataclasses.dataclass
class PlanStats:
    examples: int
    sides: dict[int, int]  # side -> examples
    shrunk: int
    truncated: int
    text_cut: int  # targets cut to their bucket's length T_L
    batches_per_epoch: int
    left_out_per_epoch: int  # examples that sit each epoch out (bucket remainders)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class BatchPlan:
    """The deterministic bucketed batch schedule of a training corpus (see the module docstring)."""

    def __init__(
        self,
        texts: Sequence[str],
        *,
        batch_size: int,
        seed: int,
        config: render.RenderConfig,
        max_text_len: int,
        fonts: np.ndarray | None = None,
        cache: Any = None,
    ):
        """`cache`: a checked `render_corpus.RenderCache` of exactly these texts, fonts and config; batches
        then read its images instead of drawing them (same pixels)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.texts = list(texts)
        self.batch_size, self.seed, self.config, self.max_text_len = batch_size, seed, config, max_text_len
        self.cache = cache
        n = len(self.texts)
        self.fonts = sample_font_sizes(n, seed, config) if fonts is None else np.asarray(fonts, np.int32)
        laid = [canvas_side(t, int(f), config) for t, f in zip(self.texts, self.fonts, strict=True)]
        self.sides = np.asarray([s for s, _, _ in laid], np.int32)
        lens = np.asarray([len(normalize_text(t)) + 1 for t in self.texts], np.int64)
        self.buckets = {int(s): np.flatnonzero(self.sides == s) for s in np.unique(self.sides)}
        # Padding every target to the bucket's longest would make every decoder step pay for the
        # 1 % longest CoTs; they are cut instead (counted in text_cut).
        self.target_len = {
            s: int(min(max_text_len, -(-int(np.ceil(np.percentile(lens[idx], 99))) // 16) * 16))
            for s, idx in self.buckets.items()
        }
        per_epoch = sum(len(idx) // batch_size for idx in self.buckets.values())
        if per_epoch == 0:
            raise ValueError(
                f"no side bucket holds batch_size={batch_size} examples ({dict(Counter(self.sides.tolist()))} "
                "examples per side): lower the batch size or add data"
            )
        self.stats = PlanStats(
            examples=n,
            sides={s: len(idx) for s, idx in self.buckets.items()},
            shrunk=sum(int(s) for _, s, _ in laid),
            truncated=sum(int(t) for _, _, t in laid),
            text_cut=int(sum(np.sum(lens[idx] > self.target_len[s]) for s, idx in self.buckets.items())),
            batches_per_epoch=per_epoch,
            left_out_per_epoch=n - per_epoch * batch_size,
        )
        self._epoch: tuple[int, list[tuple[int, np.ndarray]]] | None = None

    def __len__(self) -> int:
        return self.stats.batches_per_epoch

    def epoch(self, e: int) -> list[tuple[int, np.ndarray]]:
        """[(side, example indices [batch_size])] of epoch e, in training order."""
        if self._epoch is None or self._epoch[0] != e:
            rng = np.random.default_rng([self.seed, e])
            batches = []
            for side, idx in sorted(self.buckets.items()):
                perm = rng.permutation(idx)
                k = len(perm) // self.batch_size
                batches += [(side, perm[i * self.batch_size:(i + 1) * self.batch_size]) for i in range(k)]
            order = rng.permutation(len(batches))
            self._epoch = (e, [batches[i] for i in order])
        return self._epoch[1]

    def batch(self, index: int) -> tuple[int, np.ndarray]:
        e, j = divmod(index, len(self))
        return self.epoch(e)[j]

    def with_seed(self, seed: int) -> BatchPlan:
        """The same examples, fonts and sides, another epoch order (e.g. for a warm-up phase)."""
        other = copy.copy(self)
        other.seed, other._epoch = seed, None
        return other

    def __getstate__(self) -> dict[str, Any]:  # workers rebuild their own epoch cache
        return {**self.__dict__, "_epoch": None}


def render_images(
    texts: Sequence[str], fonts: Sequence[int], side: int, config: render.RenderConfig
) -> np.ndarray:
    """uint8 [len(texts), side, side] grey images; every text must render to `side`."""
    out = np.empty((len(texts), side, side), np.uint8)
    for i, (t, f) in enumerate(zip(texts, fonts, strict=True)):
        r = render.render_cot_ex(t, font_size=int(f), config=config)
        if r.side != side:  # the plan and the renderer disagree: a bug, never silently mixed sides
            raise AssertionError(f"text {t[:40]!r} at {f} px rendered to side {r.side}, planned {side}")
        out[i] = np.asarray(r.image)[..., 0]
    return out


def render_train_batch(index: int, _: Any, *, plan: BatchPlan, rows: slice) -> dict[str, np.ndarray]:
    """Batch `index` of the plan (index // len(plan) is the epoch, each with its own order), only
    `rows` of it: what each grain worker calls, and what the benchmarks time. `_` is grain's
    element, unused (the index says it all)."""
    side, idx = plan.batch(index)
    idx = idx[rows]
    t = plan.target_len[side]
    if plan.cache is not None:
        images = plan.cache.images(idx, side)
    else:
        images = render_images([plan.texts[i] for i in idx], plan.fonts[idx], side, plan.config)
    return {
        "images": images,
        "targets": np.stack([encode_target(plan.texts[i], t)[0] for i in idx]),
        "index": idx.astype(np.int32),
    }


def _finish(ds: grain.MapDataset, num_workers: int, num_threads: int) -> grain.IterDataset:
    return prefetch(ds.to_iter_dataset(read_options(num_threads, 2 if num_threads else 0)), num_workers)


def make_render_dataset(
    plan: BatchPlan,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    num_epochs: int | None = None,
    num_workers: int = 0,
    num_threads: int = 1,
) -> grain.IterDataset:
    """Training batches of `plan` (global batch size plan.batch_size; this process's rows only)."""
    if plan.batch_size % shard_count:
        raise ValueError(f"batch_size={plan.batch_size} must divide by the process count {shard_count}")
    b = plan.batch_size // shard_count
    rows = slice(shard_index * b, (shard_index + 1) * b)
    ds = grain.MapDataset.range(len(plan)).repeat(num_epochs)
    ds = ds.map_with_index(functools.partial(render_train_batch, plan=plan, rows=rows))
    return _finish(ds, num_workers, num_threads)


# ---- evaluation / export: every example once, deterministic font ------------------------------


def fixed_batches(
    texts: Sequence[str], batch_size: int, config: render.RenderConfig, font_size: int | None = None
) -> tuple[list[tuple[int, np.ndarray]], np.ndarray]:
    """([(side, indices)], fonts): examples grouped by side in input order, at most batch_size each;
    `font_size` None = the config's mean size (`render.sample_font_size(None)`)."""
    f = render.sample_font_size(None, config) if font_size is None else int(font_size)
    fonts = np.full(len(texts), f, np.int32)
    sides = np.asarray([canvas_side(t, f, config)[0] for t in texts], np.int32)
    out = []
    for side in np.unique(sides):
        idx = np.flatnonzero(sides == side)
        out += [(int(side), idx[i:i + batch_size]) for i in range(0, len(idx), batch_size)]
    return out, fonts


def _render_fixed_batch(
    j: int, *, texts: Sequence[str], fonts: np.ndarray, batches: list, config: render.RenderConfig
) -> dict[str, np.ndarray]:
    side, idx = batches[j]
    return {"images": render_images([texts[i] for i in idx], fonts[idx], side, config),
            "index": np.asarray(idx, np.int32)}


def make_fixed_dataset(
    texts: Sequence[str],
    batches: list[tuple[int, np.ndarray]],
    fonts: np.ndarray,
    config: render.RenderConfig,
    *,
    num_workers: int = 0,
    num_threads: int = 1,
) -> grain.IterDataset:
    """One pass over `batches` (from `fixed_batches`), rendered ahead by threads / workers."""
    fn = functools.partial(_render_fixed_batch, texts=list(texts), fonts=fonts, batches=batches, config=config)
    return _finish(grain.MapDataset.range(len(batches)).map(fn), num_workers, num_threads)
