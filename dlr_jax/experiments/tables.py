"""The Markdown of an experiment's results (`report.build`'s dict): its table, the paper's layout of it, the gap each
latent method closes, the controls and the cost line; `write` saves it as table.md beside results.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlr_jax.experiments.baselines import DIRECT_FROM_COT
from dlr_jax.experiments.report import MIN_GAP, budget_text, budget_warning

# The benchmarks as the paper's tables name them.
BENCH_NAMES = {"gsm8k": "GSM8K", "gsm_hard": "GSM-Hard", "svamp": "SVAMP", "multiarith": "MultiArith",
               "math500": "MATH-500"}


def _paper_pm(c: Any) -> str:
    if not c:
        return "—"
    return " / ".join("—" if v is None else f"{v:g}" for v in c)


def paper_markdown(layout: Mapping[str, Any]) -> list[str]:
    benches = layout["benchmarks"]
    names = [BENCH_NAMES.get(b, b) for b in benches]
    head = ["method", *(f"{n} {w}" for n in names for w in ("Acc.", "#L")), "Avg. Acc.", "Avg. #L",
            *(f"paper {n} (Acc. / #L)" for n in names), "paper Avg. (Acc. / #L)"]
    src = (f"the paper's cells for backbone `{layout['backbone']}`" if layout["paper_on_record"] else
           f"none on record for backbone `{layout['backbone']}` (dlr_jax/experiments/paper_numbers.py): left empty")
    lines = ["In the paper's layout: Acc. = Pass@1 (%), #L = latent tokens generated, mean ± std over training "
             f"seeds; Avg. = the mean over the {len(benches)} benchmark(s), per seed. Paper columns: {src}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in layout["rows"]:
        ours = [c for b in benches for c in (_pm(r["cells"].get(b, {}).get("pass_at_1"), 100, 1),
                                             _pm(r["cells"].get(b, {}).get("L"), 1, 2))]
        paper = r["paper"] or {}
        lines.append("| " + " | ".join([r["label"], *ours, _pm(r["avg"].get("pass_at_1"), 100, 1),
                                        _pm(r["avg"].get("L"), 1, 2), *(_paper_pm(paper.get(b)) for b in benches),
                                        _paper_pm(paper.get("avg"))]) + " |")
    return [*lines, ""]


def _pm(x: Mapping[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not x:
        return "—"
    return f"{scale * x['mean']:.{digits}f} ± {scale * x['std']:.{digits}f}"


def _p(p: float | None) -> str:
    if p is None:
        return "—"
    if p != p:  # nan: fewer than 2 paired seeds or identical values
        return "n/a"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def markdown(results: Mapping[str, Any]) -> str:
    full = results["full_method"]
    lines = [f"### Experiment `{results['experiment']}`: {results['description']}", "",
             f"Command: `{results['command']}`  ", f"Machine: {results['machine']}  ",
             f"Date: {results['date']}; steps done {results['status']['steps_done']} of "
             f"{results['status']['steps_total']}{' on this machine' if results.get('merged_from') else ''}; "
             f"training seeds {results['seeds']}", ""]
    for m in results.get("merged_from", []):  # the steps count above is this machine's; each file says its own
        st = m.get("status") or {}
        lines[-2] += "  "
        lines.insert(len(lines) - 1, f"Seeds {m['seeds']} from `{m['path']}` (steps done {st.get('steps_done', '?')} "
                                     f"of {st.get('steps_total', '?')} there): `{m['command']}` on {m['machine']}, "
                                     f"{m['date']}")
    own = {m["label"]: " → ".join(m["baselines"]) for m in results["methods"]  # rows with baselines of their own
           if m.get("baselines", ["Direct-SFT"])[0] != "Direct-SFT"}
    if layout := results.get("paper_layout"):
        lines += paper_markdown(layout)
    for b, table in results["summary"].items():
        lines += [f"Benchmark `{b}`; Pass@1 mean ± std over training seeds (population std), p = paired t-test "
                  f"vs {full} over seeds.", "",
                  "| method | seeds | Pass@1 (%) | per seed (%) | #L | generated tokens / question | "
                  "wall ms / question (warm) | p vs " + full + " | training steps |",
                  "|---|---|---|---|---|---|---|---|---|"]
        budgets = results.get("training_steps", {})
        for label, row in table.items():
            per = ", ".join(f"{100 * v:.1f}" for v in row["pass_at_1"]["per_seed"])
            wall = row.get("warm_wall_s_per_question") or row.get("wall_s_per_question")
            seen = {budget_text(st) for sd, st in budgets.get(label, {}).items() if int(sd) in row["seeds"]}
            steps = next(iter(seen)) if len(seen) == 1 else ("differ by seed" if seen else "—")
            lines.append(f"| {label} | {len(row['seeds'])} | {_pm(row['pass_at_1'], 100)} | {per} | "
                         f"{_pm(row.get('L'), 1, 2)} | {_pm(row.get('gen_tokens'))} | {_pm(wall, 1000, 2)} | "
                         f"{_p(row.get('p_vs_full'))} | {steps} |")
        if warning := budget_warning(budgets):
            lines += ["", warning]
        matched = bool(results.get("gap_closed_matched"))
        for key, what, after in (
                ("gap_closed", "Direct-SFT → CoT-SFT gap" + (" (baselines of the config's own length)" if matched
                                                              else ""), ""),
                ("gap_closed_matched", "gap between the budget-matched baselines",
                 " (DLR-Full adds its GRPO steps to DLR-SFT's budget)")):
            if gaps := results.get(key, {}).get(b, {}):
                shares = {lab: g for lab, g in gaps.items() if not g.get("too_small")}
                small = {lab: g for lab, g in gaps.items() if g.get("too_small")}
                if shares:
                    lines += ["", f"Share of the {what} closed (per seed, then mean ± std): " + "; ".join(
                        f"{lab} {100 * g['mean']:.0f} ± {100 * g['std']:.0f} %"
                        + (f" (of its own baselines' gap, {own[lab]})" if lab in own and
                           key == "gap_closed" else "") for lab, g in shares.items())
                        + (after if "DLR-Full" in shares else "") + "."]
                if small:
                    lines += ["", f"Share of the {what} not reported for " + ", ".join(small) + ": the gap is "
                              + ", ".join(sorted({f"{100 * g['gap']:.1f}" for g in small.values()}))
                              + f" points, below {100 * MIN_GAP:.0f} (a share of it would be noise)."]
        if d := results.get("dlr_sft_vs_direct_from_cot", {}).get(b):
            lines += ["", f"DLR-SFT minus {DIRECT_FROM_COT} (the same CoT-SFT start and as many training examples, "
                      f"no latents): {100 * d['mean']:+.1f} ± {100 * d['std']:.1f} points over {len(d['per_seed'])} "
                      f"seeds, paired p = {_p(d['p'])}: what the latent tokens add beyond that start."]
        for c in results.get("cost", {}).get(b, []):
            if c["vs"] != full:
                continue
            parts = [f"#L {c['L_ratio']:.1f}×" if "L_ratio" in c else None,
                     f"generated tokens {c['gen_tokens_ratio']:.1f}×" if "gen_tokens_ratio" in c else None,
                     f"wall time per question {c['warm_wall_s_per_question_ratio']:.1f}× (warm)"
                     if "warm_wall_s_per_question_ratio" in c else None,
                     f"{c['wall_s_per_question_ratio']:.1f}× counting the batches that compiled"
                     if "wall_s_per_question_ratio" in c else None]
            lines += ["", f"Latent vs CoT cost (CoT-SFT / {full}, same backbone, same evaluation batches): "
                      + ", ".join(p for p in parts if p) + "."]
        lines.append("")
    return "\n".join(lines)


def write(results: Mapping[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "table.md").write_text(markdown(results))
