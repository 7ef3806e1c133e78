"""A table of plans (`dlr_jax.plan.cli`) for several configs, stages and devices, written to BENCHMARKS.md.

    JAX_PLATFORMS=cpu python -m dlr_jax.bench.plan_report --configs configs/llama3.1-8b.yaml,configs/qwen3-4b.yaml \\
        --stages sft,rl,rollout --devices h100,tpu-v5p --out BENCHMARKS.md

Each cell is one deviceless compile (`plan.plan_once`). For the stages whose rows are tokens (textsft, align, sft)
the configured training data's sequence lengths are measured (once, cached: `dlr_jax.plan.lengths`;
`--no-lengths` skips them) and a second table sets each stage's total in packed rows beside the padded one, FLOPs
and time at the roofline (`packed_table`). `--jsonl F` also keeps every plan as a line of
JSON (with the command and machine that made it), and `--from-jsonl F1,F2` rebuilds the table from such files
without compiling again: rows of several runs (another config's stages, the TPU compiler's own environment)
in one table, each run's command named.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

GiB = 1 << 30


def commands(rows: Sequence[dict[str, Any]], command: str, machine: str) -> str:
    """The commands that made `rows` (a row's own "command" and "machine", else the given ones), in order:
    "`c1` (m1); rows of cfg: `c2` (m2)"."""
    runs: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        names = runs.setdefault((r.get("command", command), r.get("machine", machine)), [])
        if r.get("config", "") not in names:
            names.append(r.get("config", ""))
    text = [f"`{c}` ({m})" if i == 0 else f"rows of {', '.join(runs[c, m])}: `{c}` ({m})"
            for i, (c, m) in enumerate(runs)]
    return "; ".join(text) or f"`{command}` ({machine})"


def table(rows: Sequence[dict[str, Any]], *, command: str, machine: str) -> str:
    out = [
        "## plan: deviceless AOT compiles of the paper recipe (per device)",
        f"Command: {commands(rows, command, machine)}. Memory is XLA's buffer assignment for the target (peak = "
        "arguments + outputs - aliased + temporaries); FLOPs are counted on the step's jaxpr with every loop body "
        "times its trip count (XLA's own cost analysis sees a `while` body once); time and MFU are a roofline "
        "(max of FLOPs / peak and bytes / bandwidth), not a measurement. Every row of this table pads its sequences to "
        "the recipe's 256 tokens (global batch 64), so its stage totals assume no packing; where the stage's data "
        "could be read, the table after it sets them beside packed rows.",
        "",
        "| config | stage | device | mesh (d,f,t) | remat | peak / HBM | fits | FLOPs / step | roofline | MFU "
        "| largest vocab-sized value | stage total (paper) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r.get('config', '')} | {r['stage']} | {r['device']} | | | | error: {r['error'][:80]} "
                       "| | | | | |")
            continue
        mesh = r["mesh"]
        vocab = next(iter(r.get("vocab_values") or [v for v in r.get("largest_values", []) if v["vocab_sized"]]), None)
        vtxt = f"{vocab['dtype']}{vocab['shape']} {vocab['bytes'] / (1 << 20):,.0f} MiB" if vocab else ""
        total = r.get("stage_total_flops")
        ttxt = f"{total / 1e15:,.0f} P" if total else ""
        if r.get("paper_total_flops"):
            ttxt += f" ({r['paper_total_flops'] / 1e15:,.0f} P)"
        mfu = r.get("roofline_mfu")
        out.append(
            f"| {r.get('config', '')} | {r['stage']} | {r['device']} | {mesh['data']},{mesh['fsdp']},{mesh['tensor']}"
            f"{' (decodes on ' + ','.join(str(v) for v in r['run_mesh'].values()) + ')' if 'run_mesh' in r else ''} "
            f"| {r['remat']} | {r['peak_bytes'] / GiB:.1f} / {r['hbm_bytes'] / GiB:.0f} GiB | "
            f"{'yes' if r['fits'] else '**no**'} | {r['flops_per_step']:.2e} | "
            f"{r['roofline_step_s'] * 1e3:.0f} ms ({r['roofline_bound']}) | "
            f"{'' if mfu is None else f'{100 * mfu:.0f} %'} | {vtxt} | {ttxt} |")
    out += ["", "Notes: the GRPO update (`rl`) row is one optimizer step over 64 rollouts (μ = 4 such steps per "
            "RL step); `rollout` is the decode loop of one RL step's 64 rollouts (2 prompts × G 32) over a full "
            "KV cache, decoded from the policy's sampling copy (`rl.sample_mesh=auto`, `rl.sample_dtype=auto`: bf16 "
            "weights, tensor-parallel inside a host: 8 ways on the 8-GPU node, 4 ways x data 2 on v5p 2x2x2, whose "
            "chips sit on 2 hosts); the paper's RL figure covers rollouts, scoring and updates together. Stage totals "
            "count every "
            "row at the full 256 tokens over the whole split (300k SFT examples x 3 epochs, 85,620 RL prompts; "
            "an RL step's 2 prompts x G 32 rollouts get μ = 4 updates); they are far above the paper's figures, "
            "whose sequence lengths and backbone the paper does not state for that table: read them as an upper "
            "bound. Logits never exist as [batch, seq, vocab] fp32: the loss and the GRPO log-probs run over "
            "sequence chunks (issue 19). A training step's largest vocabulary-sized value is the text head's fp32 "
            "weight gradient, hidden x text rows (in either order): each device's partial sum over its share of "
            "the batch, before the reduce-scatter that shards it."]
    packed = packed_table(rows)
    return "\n".join(out) + "\n" + (f"\n{packed}" if packed else "")


def packed_table(rows: Sequence[dict[str, Any]]) -> str:
    """The stage totals of the plans that have packed ones (`plan.totals.packed_totals`), padded and packed side by
    side: steps, FLOPs a step, the whole stage's FLOPs and its time at the roofline (`plan.totals.stage_times`);
    then how each stage's lengths were measured. "" when no plan has packed totals."""
    from dlr_jax.plan.cli import format_duration

    rows = [r for r in rows if "stage_steps_packed" in r and "error" not in r]
    if not rows:
        return ""
    p = lambda x: f"{x / 1e15:,.0f} P"  # noqa: E731
    t = lambda r, k: format_duration(r[k]) if k in r else "—"  # noqa: E731
    out = ["### Padded vs packed rows: whole-stage totals",
           "A row of `data.max_len` tokens holds one example (padded) or several (packed, `data.pack=true`, the "
           "packer replayed on the measured lengths of the configured training data). Under `data.pack_batch=exact` "
           "(the paper configs) a step keeps the padded step's batch_size examples in the rows its fullest "
           "micro-batch needs: as many steps, each on fewer rows (its FLOPs scale with them); under `rows` a step "
           "is batch_size packed rows, the padded step's program, so an epoch takes fewer steps. sft's dual branch "
           "computes S OCR rows a packed row, one a segment slot (`data.ocr_rows.ocr_slots`), a step counted and "
           "compiled apart. Time = steps x the roofline step time on the row's devices, a bound, not a measurement.",
           "",
           "| config | stage | device | tokens: mean / p95 / max | examples a row | steps (padded / packed) "
           "| FLOPs / step (padded / packed) | stage total, padded (paper) | stage total, packed | packed / padded "
           "| roofline, padded | roofline, packed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes: dict[str, list[str]] = {}
    for r in rows:
        step = r.get("flops_per_step_packed", r["flops_per_step"]) * r.get("packed_row_share", 1.0)
        ocr = f" ({r['ocr_slots']} OCR rows a row)" if "ocr_slots" in r else ""
        paper = f" ({p(r['paper_total_flops'])})" if r.get("paper_total_flops") else ""
        out.append(
            f"| {r.get('config', '')} | {r['stage']} | {r['device']} | {r['length_mean']:.0f} / "
            f"{r['length_p95']:.0f} / {r['length_max']} | {r['examples_per_row']:.2f} | "
            f"{r['stage_steps']:,} / {r['stage_steps_packed']:,} | {r['flops_per_step']:.3g} / {step:.3g}{ocr} | "
            f"{p(r['stage_total_flops'])}{paper} | {p(r['stage_total_flops_packed'])} | "
            f"{r['stage_total_flops_packed'] / r['stage_total_flops']:.2f} | {t(r, 'stage_roofline_s')} | "
            f"{t(r, 'stage_roofline_s_packed')} |")
        notes.setdefault("; ".join(r.get("lengths_notes", [])), []).append(f"{r.get('config', '')} {r['stage']}")
    out.append("")
    out += [f"Lengths of {', '.join(dict.fromkeys(who))}: {what}." for what, who in notes.items()]
    return "\n".join(out) + "\n"


def _compilers() -> str:
    """The versions that decide what a deviceless compile does (a table from another libtpu may differ)."""
    from importlib import metadata

    found = []
    for dist in ("jaxlib", "jax-cuda12-plugin", "libtpu"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"no {dist}")
    return ", ".join(found)


def main(argv: Sequence[str] | None = None) -> int:
    from dlr_jax.bench.common import write_section

    ap = argparse.ArgumentParser(prog="python -m dlr_jax.bench.plan_report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="configs/llama3.1-8b.yaml,configs/qwen3-4b.yaml")
    ap.add_argument("--stages", default="sft,rl,rollout")
    ap.add_argument("--devices", default="h100,tpu-v5p")
    ap.add_argument("--mesh", default="data=1,fsdp=8,tensor=1")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                    help="a config override for every config (e.g. codebook.init_from=DIR), repeatable")
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    ap.add_argument("--jsonl", type=Path, help="also write every plan here, one JSON object a line")
    ap.add_argument("--from-jsonl", help="build the table from saved plans (each with a 'config' key): files, "
                    "comma-separated; a row without its own command and machine is said to come from this one's")
    ap.add_argument("--machine", help="the machine of rows that do not name theirs (default: this one, today)")
    ap.add_argument("--no-lengths", action="store_true",
                    help="do not read the training data for its sequence lengths (no packed totals)")
    a = ap.parse_args(argv)
    command = ("JAX_PLATFORMS=cpu python -m dlr_jax.bench.plan_report " +
               f"--configs {a.configs} --stages {a.stages} --devices {a.devices} --mesh {a.mesh}" +
               "".join(f" --set {o}" for o in a.overrides) + (" --no-lengths" if a.no_lengths else ""))
    day = datetime.date.today().isoformat()
    machine = a.machine or f"{platform.processor() or platform.machine()} host, no accelerator, {day}; {_compilers()}"
    rows: list[dict[str, Any]] = []
    if a.from_jsonl:
        rows = [json.loads(line) for f in a.from_jsonl.split(",") for line in Path(f).read_text().splitlines()
                if line.startswith("{")]
    else:
        from dlr_jax.config import load_config
        from dlr_jax.core.sharding import parse_mesh_spec
        from dlr_jax.plan import cli as plan
        from dlr_jax.plan.targets import TARGETS

        shape = parse_mesh_spec(a.mesh)
        for path in a.configs.split(","):
            cfg = load_config(path, a.overrides)
            # the stage's data lengths (for its packed totals) are the config's, whatever the device
            lengths = {stage: plan.measured_lengths(cfg, stage, skip=a.no_lengths) for stage in a.stages.split(",")}
            for device in a.devices.split(","):
                for stage in a.stages.split(","):
                    measured, skipped = lengths[stage]
                    try:
                        r = plan.plan_once(cfg, stage, TARGETS[device], shape, measured)
                        if skipped:
                            r["notes"].append(skipped)
                    except Exception as e:  # noqa: BLE001 - a failed compile is a row of the table
                        r = {"stage": stage, "device": device, "error": f"{type(e).__name__}: {e}"}
                    r |= {"config": Path(path).stem, "command": command, "machine": machine}
                    rows.append(r)
                    print(plan.format_plan(r) if "error" not in r else r, flush=True)
                    if a.jsonl:
                        with open(a.jsonl, "a") as f:
                            f.write(json.dumps(r, default=float) + "\n")
    write_section(a.out, "plan", table(rows, command=command, machine=machine))
    print(f"wrote the plan section of {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
