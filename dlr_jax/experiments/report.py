"""From the evaluations' results files to W/NAME/results.json and W/NAME/table.md: per seed and
method Pass@1, #L, generated tokens and wall seconds per question; then mean ± std over seeds, the
paired p-value against the full method, the share of the Direct→CoT gap a method closes, and the
cost of latent vs textual reasoning (CoT-SFT vs the DLR rows on the same backbone). `build` makes the dict;
`tables.write` saves it with its Markdown."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dlr_jax.config import to_dict
from dlr_jax.core.machine import cpu_model
from dlr_jax.experiments.baselines import DIRECT_FROM_COT, MATCHED_COT, MATCHED_DIRECT
from dlr_jax.experiments.paper_numbers import paper_rows
from dlr_jax.experiments.plan import PAPER_TABLES
from dlr_jax.experiments.runner import seed_dir
from dlr_jax.experiments.stats import mean_std, paired_t_test
from dlr_jax.experiments.variants import Experiment, Method
from dlr_jax.run.workdir import final_dir, stage_dir, workdir_config

FIELDS = ("pass_at_1", "L", "n_latents", "gen_tokens", "wall_s_per_question", "warm_wall_s_per_question")


def has_matched_baselines(exp: Experiment) -> bool:
    return any(m.label == MATCHED_COT for m in exp.methods)


def results_path(root: Path, seed: int, m: Method) -> Path:
    return seed_dir(root, seed) / m.variant / m.stage / "eval" / (f"results_{m.tag}.json" if m.tag else "results.json")


def read_method(root: Path, seed: int, m: Method) -> dict[str, dict[str, Any]] | None:
    """{benchmark: {field: value (the evaluation's mean over its eval seeds), "n": n}} or None if not yet run."""
    f = results_path(root, seed, m)
    if not f.is_file():
        return None
    res = json.loads(f.read_text())
    out = {}
    for bench, r in res["benchmarks"].items():
        row: dict[str, Any] = {"n": r["n"], "file": str(f)}
        for k in FIELDS:
            if k in r:
                row[k] = float(r[k]["mean"])
        out[bench] = row
    return out


# The stages a method's model was trained through, in order: from-scratch configs start the latent
# stages from the CoT-SFT model; with `init_from` they (and both text SFTs) start from the checkpoint.
LINEAGE = {"textsft_direct": ("textsft_direct",), "textsft_cot": ("textsft_cot",), "align": ("textsft_cot", "align"),
           "sft": ("textsft_cot", "align", "sft"), "rl": ("textsft_cot", "align", "sft", "rl"),
           "textsft_direct_from_cot": ("textsft_cot", "textsft_direct_from_cot")}
STEP_NAMES = {"textsft_direct": "Direct-SFT", "textsft_cot": "CoT-SFT", "align": "align", "sft": "SFT", "rl": "GRPO",
              "textsft_direct_from_cot": "Direct-SFT"}


def stage_steps(workdir: Path, stage: str) -> int | None:
    """Steps a finished stage trained (optimizer steps; GRPO steps for rl): the last `step` of its
    metrics.jsonl; None while it has no final checkpoint."""
    f = stage_dir(workdir, stage) / "metrics.jsonl"
    if not f.is_file() or not (final_dir(workdir, stage) / "meta.json").is_file():
        return None
    steps = [json.loads(line).get("step") for line in f.read_text().splitlines() if line.strip()]
    steps = [int(x) for x in steps if x is not None]
    return max(steps) if steps else None


def training_steps(root: Path, seed: int, m: Method) -> dict[str, int] | None:
    """{stage: steps} of every stage the method's model went through, or None if one is not finished."""
    w = seed_dir(root, seed) / m.variant
    chain = LINEAGE.get(m.stage)
    if chain is None or not (w / "config.yaml").is_file():
        return None
    if workdir_config(w).init_from and len(chain) > 1:
        chain = chain[1:]  # the latent stages start from the checkpoint, not from CoT-SFT
    steps = {st: stage_steps(w, st) for st in chain}
    return None if any(v is None for v in steps.values()) else steps  # type: ignore[return-value]


def budget_text(steps: Mapping[str, int]) -> str:
    """"800 CoT-SFT + 100 align + 1600 SFT + 40 GRPO"."""
    return " + ".join(f"{n} {STEP_NAMES.get(st, st)}" for st, n in steps.items())


def budget_warning(budgets: Mapping[str, Mapping[str, Mapping[str, int]]]) -> str | None:
    """A sentence when Direct-SFT trained fewer supervised steps than DLR-SFT's model did in all (then a
    DLR-SFT > Direct-SFT row says as much about the budget as about the latents), else None."""
    if budgets.get(MATCHED_DIRECT):  # the table has the matched rows: they are the fair comparison
        return None
    direct, dlr = budgets.get("Direct-SFT", {}), budgets.get("DLR-SFT", {})
    short = [(d, t) for s in direct if s in dlr and (d := sum(direct[s].values())) < (t := sum(dlr[s].values()))]
    if not short:
        return None
    d, t = short[0]
    return (f"Training budgets differ: Direct-SFT trained {d} steps, DLR-SFT's model {t} in all (it starts from "
            f"CoT-SFT), so DLR-SFT vs Direct-SFT mixes the latents with the extra training; "
            f"`--matched-baselines` adds Direct-SFT and CoT-SFT trained on as many examples; "
            f"`--set train.textsft_direct.num_steps={t}` gives Direct-SFT the same number of steps (with "
            "`--set train.textsft_direct.num_epochs=0` where the config trains by epochs).")


def machine() -> str:
    model = cpu_model()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {usable} usable cores; python {platform.python_version()}"


def reward_curves(root: Path, seeds: Sequence[int], variants: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per variant with an rl stage and seed: the held-out/pool reward curve (`eval/reward` rows) and the
    per-step training reward, from <workdir>/rl/metrics.jsonl."""
    out: dict[str, dict[str, Any]] = {}
    for v in variants:
        for s in seeds:
            f = seed_dir(root, s) / v / "rl" / "metrics.jsonl"
            if not f.is_file() or f.parent.parent.joinpath("rl").is_symlink():
                continue
            evals: dict[int, tuple[float, float]] = {}
            train: dict[int, float] = {}
            for line in f.read_text().splitlines():  # a resumed run repeats steps: the last row wins
                m = json.loads(line)
                if "eval/reward" in m:
                    evals[int(m["step"])] = (float(m["eval/reward"]), float(m.get("eval/accuracy", float("nan"))))
                if "reward" in m:
                    train[int(m["step"])] = float(m["reward"])
            out.setdefault(v, {})[str(s)] = {"eval": [[k, *evals[k]] for k in sorted(evals)],
                                             "train": [[k, train[k]] for k in sorted(train)]}
    return out


def summarise(exp: Experiment, per_seed: Mapping[str, Mapping[int, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """{benchmark: {label: {field: {"mean", "std", "per_seed"}, "seeds", "p_vs_full", "t_vs_full"}}}."""
    benches: list[str] = []
    for rows in per_seed.values():
        for r in rows.values():
            benches += [b for b in (r or {}) if b not in benches]
    full = per_seed.get(exp.full, {})
    out: dict[str, Any] = {}
    for b in benches:
        table: dict[str, Any] = {}
        for m in exp.methods:
            have = {s: r[b] for s, r in per_seed[m.label].items() if r and b in r}
            if not have:
                continue
            row: dict[str, Any] = {"seeds": sorted(have), "n": next(iter(have.values()))["n"]}
            for k in FIELDS:
                vals = [have[s][k] for s in sorted(have) if k in have[s]]
                if len(vals) == len(have):
                    mu, sd = mean_std(vals)
                    row[k] = {"mean": mu, "std": sd, "per_seed": vals}
            if m.label != exp.full:
                common = [s for s in sorted(have) if full.get(s) and b in full[s]]
                t, p = paired_t_test([have[s]["pass_at_1"] for s in common],
                                     [full[s][b]["pass_at_1"] for s in common])
                row.update(t_vs_full=t, p_vs_full=p, paired_seeds=common)
            table[m.label] = row
        out[b] = table
    return out


# Below this mean Direct→CoT gap (Pass@1) a share of it is noise over noise (a 500-question Pass@1 moves by
# ~2 points between evaluations of similar models): the report says the gap is too small instead.
MIN_GAP = 0.05


def gap_closed(per_seed: Mapping[str, Mapping[int, Any]], bench: str, label: str, *, direct: str = "Direct-SFT",
               cot: str = "CoT-SFT") -> dict[str, Any] | None:
    """(method - Direct-SFT) / (CoT-SFT - Direct-SFT) of Pass@1, per seed, then mean ± std — the issue's
    "closes x % of the Direct→CoT gap" (`direct`, `cot`: the baseline rows, e.g. the matched ones); None
    without the three rows."""
    need = (direct, cot, label)
    if not all(k in per_seed for k in need):
        return None
    vals, gaps = [], []
    for s, r in per_seed[label].items():
        d, c = per_seed[direct].get(s), per_seed[cot].get(s)
        if r and d and c and bench in r and bench in d and bench in c:
            gap = c[bench]["pass_at_1"] - d[bench]["pass_at_1"]
            gaps.append(gap)
            if gap != 0:
                vals.append((r[bench]["pass_at_1"] - d[bench]["pass_at_1"]) / gap)
    if gaps and sum(gaps) / len(gaps) < MIN_GAP:
        return {"too_small": True, "gap": sum(gaps) / len(gaps)}
    if not vals:
        return None
    mu, sd = mean_std(vals)
    return {"mean": mu, "std": sd, "per_seed": vals}


def paired_difference(per_seed: Mapping[str, Mapping[int, Any]], bench: str, a: str, b: str) -> dict[str, Any] | None:
    """Pass@1 of row a minus row b over the seeds both have: mean ± std of the per-seed differences and the
    paired t-test; None without both rows."""
    if a not in per_seed or b not in per_seed:
        return None
    pairs = [(ra[bench]["pass_at_1"], rb[bench]["pass_at_1"]) for s, ra in per_seed[a].items()
             if ra and bench in ra and (rb := per_seed[b].get(s)) and bench in rb]
    if not pairs:
        return None
    diffs = [x - y for x, y in pairs]
    mu, sd = mean_std(diffs)
    t, p = paired_t_test([x for x, _ in pairs], [y for _, y in pairs])
    return {"mean": mu, "std": sd, "per_seed": diffs, "t": t, "p": p}


def cost(table: Mapping[str, Any], methods: Sequence[Method]) -> list[dict[str, Any]]:
    """Each latent row vs the CoT-SFT of its own backbone (`Method.baselines`): ratios of mean #L,
    generated tokens and wall seconds per question (warm, i.e. without the batch that compiled, when
    measured)."""
    out = []
    for m in methods:
        row, cot = table.get(m.label), table.get(m.baselines[1])
        if m.is_text_baseline or not row or not cot:
            continue
        item: dict[str, Any] = {"vs": m.label}
        for k in ("L", "gen_tokens", "wall_s_per_question", "warm_wall_s_per_question"):
            if k in row and k in cot and row[k]["mean"] > 0:
                item[f"{k}_ratio"] = cot[k]["mean"] / row[k]["mean"]
        out.append(item)
    return out


# Config keys added after runs had recorded their recipe: at these defaults they are left out of the hash,
# so the same recipe run at an older commit (on another machine, say) still merges.
LATER_KEYS = {("data", "synthetic_wording"): "base", ("data", "synthetic_distractor_rate"): 0.0,
              ("data", "synthetic_cot_style"): "equations", ("data", "gsm8k_cot"): "equations",
              ("data", "pack_batch"): "rows"}


def recipe_hash(cfg: Any) -> str:
    """A short hash of the resolved config (file and `--set` list together): equal on two machines
    exactly when they train the same recipe, whatever path the config was given by."""
    d = to_dict(cfg)
    data = d.get("data", {})
    if data.get("pack") and data.get("pack_batch") == "exact":  # packed steps that train the padded run's steps
        data["pack"] = False
    if not data.get("pack", False):  # read only when packing
        data.pop("pack_batch", None)
    for (section, key), default in LATER_KEYS.items():
        if d.get(section, {}).get(key, default) == default:
            d.get(section, {}).pop(key, None)
    return hashlib.sha256(yaml.safe_dump(d, sort_keys=False).encode()).hexdigest()[:16]


def load_merge(path: Path, exp: Experiment, *, config: str, overrides: Sequence[str],
               recipe: str) -> dict[str, Any]:
    """Another run's results.json of the same experiment and recipe (e.g. `--seed-ids 1,2` on a second
    machine), checked: a different experiment, config or `--set` list would mix recipes in one table."""
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--merge {path}: cannot read it as a results.json ({e})") from None
    if not isinstance(res, dict) or not isinstance(res.get("methods"), list):
        raise ValueError(f"--merge {path}: not an experiment's results.json (no 'methods' list)")
    if res.get("experiment") != exp.name:
        raise ValueError(f"--merge {path}: it is experiment {res.get('experiment')!r}, this run is {exp.name!r}")
    if list(res.get("overrides", [])) != list(overrides):  # in order: the last --set of a key wins
        raise ValueError(f"--merge {path}: its runs used --set {res.get('overrides')}, this one --set "
                         f"{list(overrides)}; one table must hold one recipe")
    mine = has_matched_baselines(exp)
    if bool(res.get("matched_baselines", False)) != mine:  # files written before the flag existed had none
        raise ValueError(f"--merge {path}: it was run {'with' if not mine else 'without'} --matched-baselines, this "
                         f"run {'with' if mine else 'without'}; one table must hold the same rows for every seed")
    theirs_rows = {m.get("label") for m in res["methods"]}
    if missing := [m.label for m in exp.methods if m.label not in theirs_rows]:  # e.g. a row added since it ran
        raise ValueError(f"--merge {path}: it has no {', '.join(missing)} row(s); one table must hold the same rows "
                         "for every seed (rerun it with this version, or leave it out)")
    theirs = res.get("recipe")
    if theirs is None:  # written before results.json recorded the recipe: the config file's name must match
        if Path(str(res.get("config"))).name != Path(config).name:
            raise ValueError(f"--merge {path}: its config is {res.get('config')}, this run's {config}")
    elif theirs != recipe:
        raise ValueError(f"--merge {path}: its resolved config ({res.get('config')}, recipe {theirs}) differs "
                         f"from this run's ({config}, recipe {recipe}); one table must hold one recipe")
    return res


def _fold(per_seed: dict[str, dict[int, Any]], steps: dict[str, dict[str, Any]], curves: dict[str, dict[str, Any]],
          other: Mapping[str, Any]) -> list[int]:
    """Adds the seeds `other` has and this run lacks (this run's own results win); returns them."""
    added: set[int] = set()
    for m in other.get("methods", []):
        mine = per_seed.get(m["label"])
        if mine is None:
            continue
        for s, r in m.get("per_seed", {}).items():
            if r and mine.get(int(s)) is None:
                mine[int(s)] = r
                added.add(int(s))
                if (st := other.get("training_steps", {}).get(m["label"], {}).get(s)) is not None:
                    steps.setdefault(m["label"], {})[s] = st
    for v, by_seed in other.get("reward_curves", {}).items():
        for s, c in by_seed.items():
            if int(s) in added:
                curves.setdefault(v, {}).setdefault(s, c)
    return sorted(added)


def build(exp: Experiment, *, root: Path, seeds: Sequence[int], command: str, config: str,
          overrides: Sequence[str], steps_done: int, steps_total: int,
          merge: Sequence[tuple[Path, Mapping[str, Any]]] = (), recipe: str | None = None) -> dict[str, Any]:
    """`merge`: (path, results.json) of runs of other seeds (see load_merge), folded in after this run's."""
    per_seed: dict[str, dict[int, Any]] = {m.label: {s: read_method(root, s, m) for s in seeds} for m in exp.methods}
    steps = {m.label: {str(s): st for s in seeds if (st := training_steps(root, s, m))} for m in exp.methods}
    curves = reward_curves(root, seeds, [v.name for v in exp.variants if "rl" in v.runs])
    merged = []
    for path, other in merge:
        added = _fold(per_seed, steps, curves, other)
        merged.append({"path": str(path), "seeds": added, "command": other.get("command"),
                       "machine": other.get("machine"), "date": other.get("date"), "status": other.get("status")})
    seeds = sorted({s for rows in per_seed.values() for s, r in rows.items() if r} | set(seeds))
    per_seed = {k: {s: v.get(s) for s in seeds} for k, v in per_seed.items()}
    summary = summarise(exp, per_seed, seeds)
    results: dict[str, Any] = {
        "experiment": exp.name, "description": exp.description, "full_method": exp.full,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine(),
        "command": command, "config": config, "overrides": list(overrides), "recipe": recipe,
        "matched_baselines": has_matched_baselines(exp), "seeds": list(seeds),
        "status": {"steps_done": steps_done, "steps_total": steps_total},
        "notes": ["pass_at_1 in [0, 1]; std = population std (ddof=0) over training seeds",
                  "p_vs_full: paired t-test of Pass@1 over the seeds both rows have (two-sided)",
                  "run.seed also seeds the synthetic data generator: each seed has its own train/test draw, "
                  "shared by every method of that seed (the pairing)",
                  "wall_s_per_question: generation seconds / questions of each evaluation, the batch that "
                  "compiled included; warm_: only the batches that compiled nothing"],
        "methods": [{"label": m.label, "variant": m.variant, "stage": m.stage, "force_latents": m.force_latents,
                     "group": m.group, "x": m.x, "baselines": list(m.baselines),
                     "per_seed": {str(s): r for s, r in per_seed[m.label].items() if r}} for m in exp.methods],
        "summary": summary,
        "reward_curves": curves,
        "training_steps": steps,
    }
    if merged:
        results["merged_from"] = merged
    latent = [m for m in exp.methods if not m.is_text_baseline]
    results["gap_closed"] = {b: {m.label: g for m in latent if (g := gap_closed(
        per_seed, b, m.label, direct=m.baselines[0], cot=m.baselines[1])) is not None} for b in summary}
    if MATCHED_COT in per_seed:
        results["gap_closed_matched"] = {
            b: {lab: g for lab in ("DLR-SFT", "DLR-Full")
                if (g := gap_closed(per_seed, b, lab, direct=MATCHED_DIRECT, cot=MATCHED_COT)) is not None}
            for b in summary}
    if DIRECT_FROM_COT in per_seed:  # what the latent tokens add beyond DLR-SFT's CoT-SFT start and budget
        results["dlr_sft_vs_direct_from_cot"] = {
            b: d for b in summary if (d := paired_difference(per_seed, b, "DLR-SFT", DIRECT_FROM_COT)) is not None}
    results["cost"] = {b: cost(t, exp.methods) for b, t in summary.items()}
    if exp.name in PAPER_TABLES:
        results["paper_layout"] = paper_layout(exp, per_seed, summary, backbone=Path(config).stem)
    return results


def paper_layout(exp: Experiment, per_seed: Mapping[str, Mapping[int, Any]], summary: Mapping[str, Any], *,
                 backbone: str) -> dict[str, Any]:
    """The table as the paper lays it out: per row, each benchmark's Acc. (Pass@1) and #L (mean ± std over
    training seeds), then their average over the benchmarks (per seed, over the seeds that have every benchmark),
    and the paper's own cells for this backbone where `paper_numbers` has them."""
    benches = list(summary)
    paper = paper_rows(exp.name, backbone)
    rows = []
    for m in exp.methods:
        cells = {b: {k: summary[b][m.label][k] for k in ("pass_at_1", "L") if k in summary[b].get(m.label, {})}
                 for b in benches if m.label in summary[b]}
        avg: dict[str, Any] = {}
        for k in ("pass_at_1", "L"):
            vals = [sum(r[b][k] for b in benches) / len(benches) for r in per_seed[m.label].values()
                    if r and benches and all(b in r and k in r[b] for b in benches)]
            if vals:
                mu, sd = mean_std(vals)
                avg[k] = {"mean": mu, "std": sd, "per_seed": vals}
        mine = dict((paper or {}).get(m.label, {}))
        if mine and all(b in mine and None not in mine[b] for b in benches):
            mine["avg"] = tuple(sum(mine[b][i] for b in benches) / len(benches) for i in (0, 1))
        rows.append({"label": m.label, "cells": cells, "avg": avg, "paper": mine or None})
    return {"benchmarks": benches, "backbone": backbone, "paper_on_record": paper is not None, "rows": rows}
