"""Batching and statistics of an evaluation (`dlr_jax.eval.evaluate`): length-sorted batches with one
compiled shape, per-seed means then mean ± std over seeds, and the printed results table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

STD_NOTE = "std is the population std (ddof=0) over per-seed values"


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Index batches of `batch_size` over examples sorted by length (stable); the last batch is
    padded with repeats of its last index so every batch has one compiled shape. Callers drop the
    repeats (`len(set(batch))` real rows, the first occurrences)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    out = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        out.append(np.concatenate([idx, np.full(batch_size - len(idx), idx[-1])]))
    return out


def mean_std(values: Sequence[float]) -> dict[str, Any]:
    """{"mean", "std" (ddof=0), "per_seed"} of per-seed values."""
    v = np.asarray(values, np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=0)), "per_seed": [float(x) for x in v]}


def summarise(samples: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """Per-seed means of correct / n_latents / gen_tokens (and format_ok, finished, answer_fallback: the share of
    answers the fallback gave), then mean ± std over seeds."""
    out: dict[str, Any] = {}
    per = [[s for s in samples if s["seed"] == seed] for seed in seeds]
    if any(not rows for rows in per):
        raise ValueError("every seed needs at least one sample")
    out["n"] = len(per[0])
    fields = [("pass_at_1", "correct"), ("L", "L"), ("n_latents", "n_latents"), ("gen_tokens", "gen_tokens"),
              ("finished", "finished")]
    if "format_ok" in per[0][0]:
        fields.append(("format_ok", "format_ok"))
    if "answer_fallback" in per[0][0]:
        fields.append(("answer_fallback_rate", "answer_fallback"))
    if "wall_s" in per[0][0]:  # per-seed mean of each row's share of its batch = generation seconds / n
        fields.append(("wall_s_per_question", "wall_s"))
    for name, key in fields:
        out[name] = mean_std([float(np.mean([float(s[key]) for s in rows])) for rows in per])
    return out


def format_table(results: Mapping[str, Any]) -> str:
    """benchmark | mode | n | Pass@1 % mean ± std | #L mean ± std | generated tokens."""
    head = f"{'benchmark':<24} {'mode':<7} {'n':>6}  {'Pass@1 (%)':>15}  {'#L':>13}  {'gen tok':>8}"
    lines = [head, "-" * len(head)]

    def row(name: str, m: Mapping[str, Any], mode: str) -> str:
        p, nl = m["pass_at_1"], m.get("L", m["n_latents"])
        return (f"{name:<24} {mode:<7} {m['n']:>6}  {100 * p['mean']:>7.2f} ± {100 * p['std']:<5.2f}  "
                f"{nl['mean']:>6.2f} ± {nl['std']:<4.2f}  {m['gen_tokens']['mean']:>8.1f}")

    notes = []
    for name, m in results["benchmarks"].items():
        lines.append(row(name, m, m["mode"]))
        for sub, sm in m.get("subsets", {}).items():
            lines.append(row(f"  {name}/{sub}", sm, m["mode"]))
        if m.get("answer_fallback", "off") != "off":  # answers not read from an <answer> span: say how many
            total = m["n"] * len(m.get("seeds", [0]))
            notes.append(f"{name}: the answer fallback ({m['answer_fallback']}) gave {m['answer_fallback_fired']} "
                         f"of {total} answers (generations without an <answer> span)")
    return "\n".join(lines + notes)
