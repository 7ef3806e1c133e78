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

from dlr_jax.core.files import MissingStageError


class ResultsFileError(ValueError):
    """A results.json that the aggregate cannot use; the message starts with the file (and line)."""


METRICS = ("pass_at_1", "L", "n_latents", "gen_tokens", "wall_s_per_question")


def results_file(workdir: str | Path, stage: str, tag: str = "") -> Path:
    return Path(workdir) / stage / "eval" / (f"results_{tag}.json" if tag else "results.json")


def read_results(f: Path) -> dict[str, Any]:
    """One run's results.json, checked for what the aggregate reads; a damaged or foreign file raises
    `ResultsFileError` naming it (and the line, for broken JSON)."""
    what = "expected results.json as `python -m dlr_jax.evaluate` writes it"
    try:
        r = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ResultsFileError(f"{f}:{e.lineno}: {what} ({e.msg}: column {e.colno})") from None
    benches = r.get("benchmarks") if isinstance(r, dict) else None
    if not isinstance(benches, dict) or not benches:
        raise ResultsFileError(f"{f}: {what}: no 'benchmarks' object with results in it")
    for b, m in benches.items():
        if not (isinstance(m, dict) and "n" in m and isinstance(m.get("pass_at_1"), dict)
                and "mean" in m["pass_at_1"]):
            raise ResultsFileError(f"{f}: {what}: benchmark {b!r} has no 'n' and 'pass_at_1.mean'")
    return r


def aggregate(workdirs: Sequence[str | Path], stage: str, *, tag: str = "") -> dict[str, Any]:
    if len(workdirs) < 1:
        raise ValueError("--aggregate needs at least one workdir")
    runs = []
    for w in workdirs:
        f = results_file(w, stage, tag)
        if not f.is_file():
            raise MissingStageError(f"{f}: not found; run `python -m dlr_jax.evaluate --workdir {w} --stage {stage}"
                                    f"{' --tag ' + tag if tag else ''}` first")
        runs.append((f, read_results(f)))
    first_f, first = runs[0]
    benches = list(first["benchmarks"])
    for f, r in runs[1:]:
        if list(r["benchmarks"]) != benches or r.get("mode") != first.get("mode"):
            raise ResultsFileError(f"{f}: benchmarks {list(r['benchmarks'])} / mode {r.get('mode')!r} differ from "
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
