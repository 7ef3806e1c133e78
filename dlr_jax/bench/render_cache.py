"""Render cache throughput: the codebook stage's batches read from a rendered corpus vs drawn on the fly
(issue 20).

    python -m dlr_jax.bench --out BENCHMARKS.md --only render_cache [--render-cache-corpus gsm8k_aug:valid]
        [--render-cache-examples N] [--render-cache-cases tiny,1024] [--render-cache-workers W]

Two cases, each on the corpus's CoTs:
- tiny: configs/tiny.yaml's codebook render settings (its canvas, font distribution, batch size);
- 1024: the paper's image size, every canvas 1024 px (min_side = max_side = 1024), each text made of
  consecutive CoTs joined until it holds ~3,500 characters, so the canvas is mostly written (~75 %);
  batch 8, at least 96 canvases (the CoTs cycled if they make fewer).
Each case renders its corpus once with `render_corpus.write_corpus` (the one-time cost, timed), then
runs one epoch of the stage's batch plan (`render_pipeline.make_render_dataset`: images, targets,
index) with the plan drawing its images (on the fly) and with the same plan reading them from the cache
(`BatchPlan(cache=RenderCache)`, PNG decoding included), in one thread (no worker process) and on all
cores (`--render-cache-workers`, default every core: grain worker processes). The first batches of both
agree pixel for pixel (checked). Rates are steady-state: an epoch's worth of batches is timed after the
first 3 x workers (at least 1), so worker start-up is left out. Variants are interleaved repeat by
repeat; medians are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.bench import common

TINY = common.TINY_CONFIG
CASES = ("tiny", "1024")
FILL_CHARS = 3500  # characters per 1024-px text: ~75 % of a canvas at the mean 17.5-px font
MIN_1024 = 96  # 1024-px canvases per epoch at least (the CoTs are cycled when too few)


@dataclasses.dataclass
class CaseResult:
    case: str
    sides: dict[int, int]
    images: int  # per epoch (whole batches)
    batch_size: int
    write_s: float
    cache_bytes: int
    rates: dict[str, list[float]]  # variant -> images/s per repeat

    def rate(self, variant: str) -> float:
        return statistics.median(self.rates[variant])


def _fill(texts: Sequence[str], chars: int) -> list[str]:
    """Consecutive texts joined by spaces into pieces of >= `chars` characters (the tail is dropped)."""
    out, cur = [], ""
    for t in texts:
        cur = f"{cur} {t}" if cur else t
        if len(cur) >= chars:
            out.append(cur)
            cur = ""
    return out


def case_setup(case: str, texts: Sequence[str], cfg: Any) -> tuple[list[str], Any, int]:
    """(texts, RenderConfig, batch size) of a case."""
    from dlr_jax.data import render_pipeline as rp

    rcfg = rp.render_config(cfg.codebook)
    if case == "tiny":
        return list(texts), rcfg, cfg.codebook.train.batch_size
    pool = list(texts)
    while len(_fill(pool, FILL_CHARS)) < MIN_1024 and texts:  # enough canvases for a steady state
        pool += texts
    return _fill(pool, FILL_CHARS), dataclasses.replace(rcfg, min_side=1024, max_side=1024), 8


def _rate(plan: Any, workers: int) -> float:
    """images/s over len(plan) batches (one epoch's worth; the plan repeats) in steady state: the first
    3 * workers batches (at least 1) are read untimed, so every worker process has started and the
    batches they buffered while the others started are used up."""
    from dlr_jax.data import render_pipeline as rp

    it = iter(rp.make_render_dataset(plan, num_epochs=None, num_workers=workers, num_threads=1))
    try:
        for _ in range(max(1, 3 * workers)):
            next(it)
        t0, n = time.perf_counter(), 0
        for _ in range(len(plan)):
            n += len(next(it)["images"])
        return n / (time.perf_counter() - t0)
    finally:
        it.close()  # stops grain's worker processes


def bench_case(case: str, texts: Sequence[str], cfg: Any, *, workers: int, repeats: int,
               log: Callable[[str], None] = print) -> CaseResult:
    from dlr_jax.data import render_corpus as rc
    from dlr_jax.data import render_pipeline as rp

    texts, rcfg, batch = case_setup(case, texts, cfg)
    seed = cfg.run.seed
    plan = rp.BatchPlan(texts, batch_size=batch, seed=seed, config=rcfg, max_text_len=cfg.codebook.max_text_len)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rc.write_corpus(texts, rcfg, seed, tmp, progress=False)
        write_s = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*array_record*"))
        cache = rc.RenderCache(tmp)
        cache.check(texts, rcfg, seed)
        cached = rp.BatchPlan(texts, batch_size=batch, seed=seed, config=rcfg,
                              max_text_len=cfg.codebook.max_text_len, cache=cache)
        a = rp.render_train_batch(0, None, plan=plan, rows=slice(None))
        b = rp.render_train_batch(0, None, plan=cached, rows=slice(None))
        if not all(np.array_equal(a[k], b[k]) for k in a):
            raise AssertionError(f"{case}: the cache's first batch differs from rendering it")
        variants = {"fly_1": (plan, 0), "cache_1": (cached, 0), "fly_all": (plan, workers),
                    "cache_all": (cached, workers)}
        rates: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(repeats):
            for v in variants if r % 2 == 0 else list(variants)[::-1]:
                rates[v].append(_rate(*variants[v]))
            log(f"render_cache {case}: repeat {r + 1}/{repeats}: "
                + ", ".join(f"{v} {rates[v][-1]:.0f} img/s" for v in variants))
    return CaseResult(case=case, sides=dict(sorted(plan.stats.sides.items())), images=len(plan) * batch,
                      batch_size=batch, write_s=write_s, cache_bytes=size, rates=rates)


def render_section(results: Sequence[CaseResult], *, corpus: str, examples: int, workers: int, repeats: int,
                   command: str, info: dict[str, str], load_end: str) -> str:
    lines = common.header("Render cache: codebook batches from a rendered corpus vs drawn on the fly",
                          command, info)
    lines += [
        f"Corpus: {corpus}, {examples} CoTs. Cases: tiny = configs/tiny.yaml's codebook rendering; 1024 = the "
        f"paper's image size, every canvas 1024 px holding ~{FILL_CHARS} characters (consecutive CoTs joined). "
        f"An epoch's worth of the stage's batch plan through `make_render_dataset`, steady state (after "
        f"max(1, 3 x workers) untimed batches), median of {repeats} interleaved repeats; all cores = "
        f"{workers} grain worker processes. The "
        f"machine is shared with other jobs: load average at start {info['load']}; at the end {load_end}.",
        "",
        "| case | canvas px (examples) | images/epoch | write once, img/s | on the fly, 1 thread | cache, 1 thread "
        "| cache / fly | on the fly, all cores | cache, all cores | cache / fly | cache KB/image |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        n = sum(r.sides.values())
        lines.append(
            f"| {r.case} | {', '.join(f'{s} ({k})' for s, k in r.sides.items())} | {r.images} (batch {r.batch_size})"
            f" | {n / r.write_s:,.0f} | {r.rate('fly_1'):,.0f} | {r.rate('cache_1'):,.0f}"
            f" | {r.rate('cache_1') / r.rate('fly_1'):.1f}x | {r.rate('fly_all'):,.0f} | {r.rate('cache_all'):,.0f}"
            f" | {r.rate('cache_all') / r.rate('fly_all'):.1f}x | {r.cache_bytes / n / 1024:.1f} |")
    lines += ["", "Interpretation: " + interpret(results), ""]
    return "\n".join(lines)


def interpret(results: Sequence[CaseResult]) -> str:
    parts = []
    for r in results:
        x = r.rate("cache_1") / r.rate("fly_1")
        verdict = "faster" if x > 1 else "slower"
        parts.append(f"at {r.case} the cache is {x:.1f}x the drawing rate on one thread ({verdict}: PNG decoding "
                     f"{'costs less than' if x > 1 else 'costs more than'} drawing)")
    return "; ".join(parts) + ". Every host reads its rows of each epoch instead of drawing them again."


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--render-cache-config", type=Path, default=TINY,
                    help="render_cache benchmark: config whose codebook section sets the rendering")
    ap.add_argument("--render-cache-corpus", default="gsm8k_aug:valid",
                    help="render_cache benchmark: CoTs as a load_benchmark name:split (synthetic:test needs no data)")
    ap.add_argument("--render-cache-examples", type=int, default=1024,
                    help="render_cache benchmark: the first N CoTs (0 = all)")
    ap.add_argument("--render-cache-cases", default=",".join(CASES),
                    help="render_cache benchmark: comma-separated subset of " + ",".join(CASES))
    ap.add_argument("--render-cache-workers", type=int, default=0,
                    help="render_cache benchmark: worker processes for 'all cores' (0 = os.cpu_count())")


def _cases(args: argparse.Namespace) -> list[str]:
    return [c.strip() for c in args.render_cache_cases.split(",") if c.strip()]


def check_arguments(args: argparse.Namespace) -> str | None:
    bad = [c for c in _cases(args) if c not in CASES]
    if bad or not _cases(args):
        return (f"--render-cache-cases: unknown case(s) {bad or args.render_cache_cases!r}; "
                f"choose from {','.join(CASES)}")
    if args.render_cache_examples < 0 or args.render_cache_workers < 0:
        return "--render-cache-examples and --render-cache-workers must be >= 0"
    if ":" not in args.render_cache_corpus:
        return f"--render-cache-corpus must look like name:split, got {args.render_cache_corpus!r}"
    return None


def run_section(args: argparse.Namespace, command: str, info: dict[str, str],
                log: Callable[[str], None] = print) -> str:
    """Runs the `render_cache` benchmark and returns its BENCHMARKS.md section."""
    from dlr_jax.bench.codebook import load_corpus
    from dlr_jax.config import load_config

    if err := check_arguments(args):
        raise ValueError(err)
    cfg = load_config(args.render_cache_config)
    texts = load_corpus(args.render_cache_corpus, args.render_cache_examples, cfg.codebook.render_view)
    workers = args.render_cache_workers or os.cpu_count() or 1
    results = [bench_case(c, texts, cfg, workers=workers, repeats=args.repeats, log=log) for c in _cases(args)]
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return render_section(results, corpus=args.render_cache_corpus, examples=len(texts), workers=workers,
                          repeats=args.repeats, command=command, info=info, load_end=load_end)
