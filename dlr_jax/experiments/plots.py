"""PNG plots of an experiment's results.json: Pass@1 over the K sweep, Pass@1 and #L over the forced
stop n, and the RL reward curve per seed. Each is drawn only when its data exist."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on the machines this runs on
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, ax: Any, path: Path, title: str) -> bool:
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)  # figures stay alive in pyplot's registry until closed
    return True


def _group(results: Mapping[str, Any], bench: str, group: str) -> list[tuple[float, dict[str, Any]]]:
    rows = results["summary"].get(bench, {})
    pts = [(m["x"], rows[m["label"]]) for m in results["methods"] if m["group"] == group and m["label"] in rows]
    return sorted(pts, key=lambda p: p[0])


def sweep_plot(results: Mapping[str, Any], bench: str, group: str, path: Path, *, xlabel: str,
               log_x: bool = False) -> bool:
    pts = _group(results, bench, group)
    if len(pts) < 2:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    xs = [x for x, _ in pts]
    ax.errorbar(xs, [100 * r["pass_at_1"]["mean"] for _, r in pts], yerr=[100 * r["pass_at_1"]["std"] for _, r in pts],
                marker="o", capsize=3, label="Pass@1")
    full = results["summary"][bench].get(results["full_method"])
    if group == "forced_stop" and full:
        ax.axhline(100 * full["pass_at_1"]["mean"], ls="--", color="gray",
                   label=f"dynamic (#L {full['L']['mean']:.1f})" if "L" in full else "dynamic")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"Pass@1 on {bench} (%)")
    counts = sorted({len(r["seeds"]) for _, r in pts})  # a sweep still running has points of fewer seeds
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return _save(plt, fig, ax, path, f"{results['experiment']}: mean ± std over {seeds} seed(s) a point")


def reward_plot(results: Mapping[str, Any], path: Path, variant: str = "main") -> bool:
    curves = results.get("reward_curves", {}).get(variant, {})
    if not curves:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5), dpi=120)
    for seed, c in sorted(curves.items()):
        color = None
        if c["train"]:
            (line,) = ax.plot([p[0] for p in c["train"]], [p[1] for p in c["train"]], alpha=0.35, lw=1,
                              label=f"seed {seed}: training batches")
            color = line.get_color()
        if c["eval"]:
            ax.plot([p[0] for p in c["eval"]], [p[1] for p in c["eval"]], marker="o", lw=2, color=color,
                    label=f"seed {seed}: fixed prompts")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    return _save(plt, fig, ax, path, f"latent GRPO reward ({variant})")


def write_plots(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Writes what applies of k_sweep.png, forced_stop.png (first benchmark) and rl_reward.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    bench = next(iter(results["summary"]), None)
    if bench is not None:
        if sweep_plot(results, bench, "k_sweep", out_dir / "k_sweep.png", xlabel="codebook size K", log_x=True):
            written.append(out_dir / "k_sweep.png")
        if sweep_plot(results, bench, "forced_stop", out_dir / "forced_stop.png",
                      xlabel="forced stop after n latents"):
            written.append(out_dir / "forced_stop.png")
    if reward_plot(results, out_dir / "rl_reward.png"):
        written.append(out_dir / "rl_reward.png")
    return written
