"""Combining evaluations of several training runs: mean ± std over training seeds.

    python -m dlr_jax.evaluate --aggregate runs/s0 runs/s1 runs/s2 --stage rl [--tag T] [--out F]

Each workdir's `<stage>/eval/results[_<tag>].json` (written by `python -m dlr_jax.evaluate`) gives one
value per benchmark and metric: its mean over evaluation seeds. The aggregate is the mean and the std
(population, ddof=0, as per-seed stds elsewhere) of those values over the workdirs, with the per-run
list, so a table row reads as the paper's "mean ± std over 5 seeds" when the runs differ in training
seed. Every run must have evaluated the same benchmarks in the same mode; anything else is an error
that names the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.files import MissingStageError

METRICS = ("pass_at_1", "L", "n_latents", "gen_tokens", "wall_s_per_question")


def results_file(workdir: str | Path, stage: str, tag: str = "") -> Path:
    return Path(workdir) / stage / "eval" / (f"results_{tag}.json" if tag else "results.json")


def aggregate(workdirs: Sequence[str | Path], stage: str, *, tag: str = "") -> dict[str, Any]:
    if len(workdirs) < 1:
        raise ValueError("--aggregate needs at least one workdir")
    runs = []
    for w in workdirs:
        f = results_file(w, stage, tag)
        if not f.is_file():
            raise MissingStageError(f"{f}: not found; run `python -m dlr_jax.evaluate --workdir {w} --stage {stage}"
                                    f"{' --tag ' + tag if tag else ''}` first")
        runs.append((f, json.loads(f.read_text())))
    first_f, first = runs[0]
    benches = list(first["benchmarks"])
    for f, r in runs[1:]:
        if list(r["benchmarks"]) != benches or r.get("mode") != first.get("mode"):
            raise ValueError(f"{f}: benchmarks {list(r['benchmarks'])} / mode {r.get('mode')!r} differ from "
                             f"{first_f}: {benches} / {first.get('mode')!r}")
    out: dict[str, Any] = {"stage": stage, "tag": tag, "mode": first.get("mode"), "runs": [str(f) for f, _ in runs],
                           "std": "population std (ddof=0) over runs of each run's mean over its eval seeds",
                           "benchmarks": {}}
    for b in benches:
        row: dict[str, Any] = {"n": first["benchmarks"][b]["n"]}
        for m in METRICS:
            vals = [r["benchmarks"][b][m]["mean"] for _, r in runs if m in r["benchmarks"][b]]
            if len(vals) == len(runs):
                v = np.asarray(vals, np.float64)
                row[m] = {"mean": float(v.mean()), "std": float(v.std(ddof=0)), "per_run": [float(x) for x in v]}
        out["benchmarks"][b] = row
    return out


def format_aggregate(agg: dict[str, Any]) -> str:
    head = f"{'benchmark':<20} {'runs':>4} {'n':>6}  {'Pass@1 (%)':>15}  {'#L':>13}"
    lines = [head, "-" * len(head)]
    for b, m in agg["benchmarks"].items():
        p = m["pass_at_1"]
        length = m.get("L", m.get("n_latents"))
        lines.append(f"{b:<20} {len(agg['runs']):>4} {m['n']:>6}  {100 * p['mean']:>7.2f} ± {100 * p['std']:<5.2f}  "
                     f"{length['mean']:>6.2f} ± {length['std']:<4.2f}")
    return "\n".join(lines)
