"""`python -m dlr_jax.plan --config C --stage S --mesh data=1,fsdp=8,tensor=1 --device h100|h200|tpu-v5p|cpu`

Plans a stage before renting the machine: lowers and compiles the stage's real jitted step (the
function the Trainer / sampler runs, with its shardings, dtypes, remat and donation) from abstract
shapes — no parameter is allocated — for the target's devices, deviceless (`dlr_jax.plan.targets`).
Stages: `textsft` (the CoT-SFT baseline), `align`, `sft` (+ its dual-branch OCR decoder when the stage would train
it: `latent.dual_branch` on, or auto with codebook latents of a from-scratch codebook), `rl` (the GRPO update),
`rollout` (prefill + the decode loop over a full KV cache), `codebook` (encoder + VQ + OCR decoder; the
DeepSeek-OCR-2 network with `codebook.init_from`). With `init_from` the backbone is the checkpoint's config.json
(and its tokenizer's id layout when tokenizer.json is there): only those files are read, never the weights.

Per device it prints XLA's buffer assignment (arguments, outputs, aliased, temporaries; peak =
arguments + outputs - aliased + temporaries, against the HBM), the step's FLOPs (counted on the jaxpr
with every loop body times its trip count, `dlr_jax.plan.flops`: XLA's cost analysis counts a `while`
body once, and is shown beside it), bytes accessed (XLA), tokens per step, a roofline step time
(max of FLOPs / peak and bytes / bandwidth) with the MFU it implies, and for the recipe's data size
the stage's total FLOPs next to the paper's figure: in padded rows (one example a row) and, for textsft, align and
sft, in packed rows too, from the configured data's measured sequence lengths (read once and cached,
`dlr_jax.plan.lengths`; `--refresh-lengths`, `--no-lengths`; sft's dual branch counts its packed step, S OCR rows
a row, apart: `packed_ocr_step`, and compiles it for its own roofline), each with its time at the roofline (steps x
step time, `plan.totals.stage_times`). `--search` tries remat policies, micro-batches
(grad_accum) and mesh shapes of the same device count and reports the fastest plan that fits.
`--json` prints one JSON object per plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from dlr_jax.config import Config, ConfigError, load_config
from dlr_jax.core.sharding import MESH_AXES, parse_mesh_spec, use_mesh
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.plan.buffers import largest_values
from dlr_jax.plan.lengths import Lengths
from dlr_jax.plan.programs import BOUNDARY_TOKENS as BOUNDARY_TOKENS  # noqa: F401 - public: plan.BOUNDARY_TOKENS
from dlr_jax.plan.programs import STAGES, build_program, latent_lm_abstract
from dlr_jax.plan.targets import TARGETS, Target, TargetUnavailable, target_mesh
from dlr_jax.plan.totals import PACKED_STAGES, program_flops, stage_times, stage_total_flops

# ----------------------------------------------------------------------------------------------
# Compile, measure, estimate.


MEMORY_KEYS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes", "peak_bytes")


def device_estimate(compiled: Any, per_dev_flops: float, target: Target, *, cost: bool = True) -> dict[str, Any]:
    """What a plan says of one compiled program on `target`: XLA's buffer assignment per device (`MEMORY_KEYS`;
    peak = arguments + outputs - aliased + temporaries) against the HBM, and the roofline step time (max of
    FLOPs / peak FLOP/s and bytes / bandwidth) with the MFU it implies. `per_dev_flops`: the program's counted
    FLOPs per device (`plan.flops`). `cost`: read XLA's cost analysis for the bytes (else a lower bound)."""
    mem = _memory(compiled)
    xla = _xla_cost(compiled) if cost else {}
    out: dict[str, Any] = {**mem, **xla}
    if mem:
        out["hbm_bytes"] = target.hbm_bytes
        out["fits"] = bool(mem["peak_bytes"] <= target.hbm_bytes)
    if math.isfinite(target.peak_flops):
        t_compute = per_dev_flops / target.peak_flops
        bytes_dev, source = xla.get("xla_bytes_accessed"), "xla cost analysis, loop bodies scaled like its FLOPs"
        if bytes_dev and xla.get("xla_flops_loop_bodies_once"):
            # XLA's bytes count loop bodies once too: scale by the same factor as its FLOPs
            bytes_dev *= max(1.0, per_dev_flops / max(xla["xla_flops_loop_bodies_once"], 1.0))
        elif mem:  # no cost analysis for deviceless GPU: every buffer moved at least once
            bytes_dev = mem["argument_bytes"] + mem["output_bytes"] + 2 * mem["temp_bytes"]
            source = "lower bound: arguments + outputs + 2 x temporaries (no XLA cost analysis for this target)"
        t_memory = (bytes_dev or 0.0) / target.hbm_bandwidth
        t = max(t_compute, t_memory)
        out |= {"bytes_per_device": bytes_dev, "bytes_source": source, "roofline_step_s": t,
                "roofline_compute_s": t_compute, "roofline_memory_s": t_memory,
                "roofline_bound": "compute" if t_compute >= t_memory else "memory",
                "roofline_mfu": t_compute / t if t > 0 else None}
    return out


def _memory(compiled: Any) -> dict[str, float]:
    m = compiled.memory_analysis()
    if m is None:
        return {}
    get = lambda name: float(getattr(m, name, 0) or 0)  # noqa: E731
    out = {"argument_bytes": get("argument_size_in_bytes"), "output_bytes": get("output_size_in_bytes"),
           "alias_bytes": get("alias_size_in_bytes"), "temp_bytes": get("temp_size_in_bytes"),
           "generated_code_bytes": get("generated_code_size_in_bytes")}
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    return out


def _xla_cost(compiled: Any) -> dict[str, float]:
    """XLA's cost analysis of the compiled program (loop bodies counted once). Deviceless GPU
    executables return none, so their optimised HLO is analysed by the CPU client's HLO cost model."""
    c = None
    try:
        c = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some deviceless targets do not provide it
        c = None
    if isinstance(c, list):
        c = c[0] if c else None
    if not c:
        try:
            from jax._src.lib import xla_client

            module = compiled.runtime_executable().hlo_modules()[0]
            c = xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
        except Exception:  # noqa: BLE001 - private API; without it the planner falls back to a bound
            return {}
    return {"xla_flops_loop_bodies_once": float(c.get("flops", 0.0)),
            "xla_bytes_accessed": float(c.get("bytes accessed", 0.0))}


TRITON_TILING_ERROR = "Couldn't find output tile sizes"
TRITON_FALLBACK_NOTE = (
    f"XLA's Triton GEMM tiling failed in this deviceless compile (\"{TRITON_TILING_ERROR}\"{{where}}); "
    "planned with cuBLAS GEMMs instead (xla_gpu_enable_triton_gemm=false), roofline bytes from the lower bound. "
    "Should a GPU run stop with that error, XLA_FLAGS=--xla_gpu_enable_triton_gemm=false is the workaround")
_FRAME = re.compile(r"^\s*(\S+\.py):(\d+)(?::\d+)? \[([^\]]+)\]")


def _gemm_source(error: str) -> str:
    """Where the GEMM XLA names in `error` comes from: the first frames of its "Suspected Python Code Location"
    past `dense`, the matmul every projection shares, paths relative to the package ("" when XLA names none)."""
    if "Suspected Python Code Location:" not in error:
        return ""
    frames = []
    for line in error.split("Suspected Python Code Location:", 1)[1].splitlines():
        m = _FRAME.match(line)
        if m:
            path = m.group(1)
            path = path[path.rindex("dlr_jax/"):] if "dlr_jax/" in path else Path(path).name
            frames.append((m.group(3), f"{path}:{m.group(2)} ({m.group(3)})"))
    named = [f for fn, f in frames if fn != "dense"] or [f for _, f in frames]  # dense: every projection's matmul
    return f", at {' <- '.join(named[:2])}" if named else ""


def _compile(lowered: Any, target: Target) -> tuple[Any, str | None]:
    """The compiled program, and the note when it took the cuBLAS fallback (TRITON_FALLBACK_NOTE).
    jaxlib 0.10.2's deviceless GPU compile cannot tile some bf16 GEMMs whose rows merge several dims (the SAM
    encoder's windows, a text head's gradient at some widths); a GPU autotunes, which this host cannot."""
    try:
        return lowered.compile(), None
    except Exception as e:  # noqa: BLE001 - jaxlib raises its own runtime error type
        if target.platform != "cuda" or TRITON_TILING_ERROR not in str(e):
            raise
        first = e
    try:
        compiled = lowered.compile(compiler_options={"xla_gpu_enable_triton_gemm": False})
    except Exception as e:  # noqa: BLE001
        # the retry's own error first: a --search row keeps only its first 300 characters
        raise RuntimeError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (in a retry with cuBLAS "
                           f"GEMMs, after Triton could not tile a GEMM: \"{TRITON_TILING_ERROR}\""
                           f"{_gemm_source(str(first))})") from first
    return compiled, TRITON_FALLBACK_NOTE.format(where=_gemm_source(str(first)))


def plan_once(cfg: Config, stage: str, target: Target, mesh_shape: dict[str, int],
              lengths: Lengths | None = None) -> dict[str, Any]:
    """One plan (see the module docstring). `lengths`: the stage's measured sequence lengths
    (`plan.lengths.stage_lengths`), for its packed totals beside the padded ones."""
    mesh = target_mesh(target, mesh_shape)
    with use_mesh(mesh):
        prog = build_program(cfg, stage, mesh)
    with use_mesh(prog.mesh or mesh):
        lowered = prog.jitted.lower(*prog.args)
        compiled, cublas = _compile(lowered, target)  # cublas: the fallback's note, or None
        flops = program_flops(prog)
    n = mesh.size
    per_dev_flops = flops.total / n
    # without cost analysis after the cuBLAS fallback: its FLOPs leave out the cuBLAS calls, its bytes scale wrong
    est = device_estimate(compiled, per_dev_flops, target, cost=not cublas)
    out: dict[str, Any] = {
        "stage": stage, "device": target.name, "deviceless": target.deviceless, "devices": n,
        "mesh": dict(mesh_shape), "remat": cfg.codebook.remat if stage == "codebook" else cfg.model.remat,
        "grad_accum": _accum(cfg, stage),
        "tokens_per_step": prog.tokens_per_step, "notes": list(prog.notes),
        "flops_per_step": flops.total, "flops_per_device": per_dev_flops, "matmul_flops": flops.matmul,
        "loops_counted_once": flops.unknown_loops,
        **{k: v for k, v in est.items() if k in MEMORY_KEYS or k.startswith("xla_")},
    }
    if prog.mesh is not None:  # the rollout decodes on the sampling copy's own layout
        out["run_mesh"] = {k: int(v) for k, v in prog.mesh.shape.items()}
    try:
        vocab = None
        if stage != "codebook":  # the latent LM's rows and its text rows, each whole or split over `tensor` (the
            # rollout's own, on the sampling copy's mesh)
            lat, tensor = latent_lm_abstract(cfg)[1], (prog.mesh or mesh).shape.get("tensor", 1)
            rows = {lat.total_vocab_size, lat.latent_offset}
            vocab = rows | {r // tensor for r in rows if r % tensor == 0}
        values = largest_values(compiled.as_text(), k=10_000, vocab=vocab)
        out["largest_values"] = values[:8]
        out["vocab_values"] = [v for v in values if v["vocab_sized"]][:4]  # what the vocabulary costs
    except Exception as e:  # noqa: BLE001 - itemising is a courtesy; the totals above stand without it
        out["notes"].append(f"largest values not itemised: {type(e).__name__}")
    if cublas:
        out["notes"].append(cublas)
    if target.platform == "cpu":
        out["notes"].append("CPU fake-device compile: a fallback, not a stand-in for GPU/TPU memory or speed")
    out |= {k: v for k, v in est.items() if k not in out}
    total = stage_total_flops(cfg, stage, flops.total, prog, lengths, mesh)
    if total:
        out |= total
    if "ocr_slots" in out and "roofline_step_s" in out:  # sft's dual branch: the packed step is its own program
        out |= packed_step_estimate(cfg, stage, target, mesh, out["ocr_slots"], out["flops_per_step_packed"])
    return out | stage_times(out)


def packed_step_estimate(cfg: Config, stage: str, target: Target, mesh: Any, ocr_slots: int,
                         flops_per_step: float) -> dict[str, Any]:
    """sft's dual-branch step on packed rows (`ocr_slots` OCR rows a token row), compiled for `target` on `mesh`:
    its peak memory and roofline step time (`device_estimate` with its counted `flops_per_step`), keys suffixed
    `_packed`; a compile that fails is a note, the packed step time then left out."""
    try:
        with use_mesh(mesh):
            prog = build_program(cfg, stage, mesh, ocr_slots=ocr_slots)
        with use_mesh(prog.mesh or mesh):
            compiled, cublas = _compile(prog.jitted.lower(*prog.args), target)
    except Exception as e:  # noqa: BLE001 - the padded plan stands without it
        return {"notes_packed_step": f"the packed step did not compile ({type(e).__name__}: {str(e)[:200]})"}
    est = device_estimate(compiled, flops_per_step / mesh.size, target, cost=not cublas)
    keys = ("peak_bytes", "fits", "roofline_step_s", "roofline_bound", "roofline_mfu")
    return {f"{k}_packed": est[k] for k in keys if k in est}


def _accum(cfg: Config, stage: str) -> int:
    if stage == "codebook":
        return cfg.codebook.train.grad_accum
    if stage == "rollout":
        return 1
    return getattr(cfg.train, stage).grad_accum


def search(cfg: Config, stage: str, target: Target, devices: int,
           lengths: Lengths | None = None) -> tuple[dict[str, Any] | None, list[dict]]:
    """Remat x grad_accum x mesh shapes of `devices` devices: the fastest (roofline) plan that fits."""
    meshes = []
    for tensor in (1, 2, 4, 8):
        if devices % tensor == 0:
            meshes.append({"data": 1, "fsdp": devices // tensor, "tensor": tensor})
    if devices >= 2:
        meshes.append({"data": 2, "fsdp": devices // 2, "tensor": 1})
    tried = []
    for remat in ("none", "dots", "full"):
        for accum in (1, 2, 4, 8):
            if stage == "codebook":  # the codebook's networks take codebook.remat, not the LM's
                c = dataclasses.replace(cfg, codebook=dataclasses.replace(cfg.codebook, remat=remat))
            else:
                c = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat))
            if stage in ("textsft", "align", "sft", "rl"):
                t = getattr(c.train, stage)
                if t.batch_size % (accum * devices) and t.batch_size % accum:
                    continue
                c = dataclasses.replace(c, train=dataclasses.replace(
                    c.train, **{stage: dataclasses.replace(t, grad_accum=accum)}))
            elif stage == "codebook":
                t = c.codebook.train
                if t.batch_size % accum:
                    continue
                c = dataclasses.replace(c, codebook=dataclasses.replace(
                    c.codebook, train=dataclasses.replace(t, grad_accum=accum)))
            elif accum > 1:
                continue
            for mesh in meshes:
                try:
                    r = plan_once(c, stage, target, mesh, lengths)
                except (TargetUnavailable, ConfigError):  # no compiler, or a config no row can fix: say it once
                    raise
                except Exception as e:  # noqa: BLE001 - a plan that does not compile is a row, not a crash
                    r = {"remat": remat, "grad_accum": accum, "mesh": mesh, "error": f"{type(e).__name__}: {e}"[:300]}
                tried.append(r)
    ok = [r for r in tried if r.get("fits") and "roofline_step_s" in r]
    best = min(ok, key=lambda r: r["roofline_step_s"]) if ok else None
    return best, tried


def _flops(x: float) -> str:
    return f"{x / 1e15:,.0f} PFLOPs" if x >= 1e16 else f"{x:.3g} FLOPs"


def format_duration(seconds: float) -> str:
    """Seconds as a person reads a run's length: s under two minutes, min under two hours, h beyond."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h" if seconds < 360_000 else f"{seconds / 3600:,.0f} h"


def format_plan(r: dict[str, Any]) -> str:
    g = lambda b: f"{b / (1 << 30):.2f} GiB" if b >= 1 << 30 else f"{b / (1 << 20):.1f} MiB"  # noqa: E731
    lines = [f"plan: stage {r['stage']} on {r['devices']} x {r['device']} mesh {r['mesh']} remat={r['remat']} "
             f"grad_accum={r['grad_accum']}" + ("" if r["deviceless"] else " (CPU fallback)")]
    if "peak_bytes" in r:
        lines.append(f"  memory / device: arguments {g(r['argument_bytes'])}, outputs {g(r['output_bytes'])}, "
                     f"aliased {g(r['alias_bytes'])}, temporaries {g(r['temp_bytes'])} -> peak {g(r['peak_bytes'])}"
                     + (f" of {g(r['hbm_bytes'])} HBM: {'fits' if r['fits'] else 'DOES NOT FIT'}"
                        if math.isfinite(r.get("hbm_bytes", math.inf)) else ""))
    lines.append(f"  FLOPs / step {r['flops_per_step']:.3e} ({r['flops_per_device']:.3e} per device; XLA's count "
                 f"with loop bodies once: {r.get('xla_flops_loop_bodies_once', float('nan')):.3e}); tokens / step "
                 f"{r['tokens_per_step']:,}")
    if "roofline_step_s" in r:
        lines.append(f"  roofline: {r['roofline_step_s'] * 1e3:.1f} ms / step ({r['roofline_bound']}-bound), "
                     f"MFU <= {100 * (r['roofline_mfu'] or 0):.0f} %")
    if "stage_total_flops" in r:
        paper = r.get("paper_total_flops")
        vs = f" (paper: {paper / 1e15:.0f} P)" if paper else ""
        lines.append(f"  whole stage: {r['stage_steps']:,} steps over {r['stage_examples']:,} examples = "
                     f"{_flops(r['stage_total_flops'])}{vs}"
                     + (" in padded rows" if "stage_steps_packed" in r else ""))
    if "stage_steps_packed" in r:
        ocr = (f" of {r['flops_per_step_packed']:.3e} FLOPs ({r['ocr_slots']} OCR rows a row)"
               if "flops_per_step_packed" in r else "")  # sft's dual branch: a packed step costs more
        rows = (f" of {r['packed_rows_per_step']} rows" if r.get("pack_batch") in ("examples", "exact") else "")
        lines.append(f"  packed rows: {r['examples_per_row']:.2f} examples a row, {100 * r['packed_efficiency']:.0f}% "
                     f"of tokens real (padded: {100 * r['padded_efficiency']:.0f}%) -> {r['stage_steps_packed']:,} "
                     f"steps{rows}{ocr} = {_flops(r['stage_total_flops_packed'])} "
                     f"(this config: data.pack={str(r['data_pack']).lower()}"
                     + (f", data.pack_batch={r['pack_batch']})" if "pack_batch" in r else ")"))
        lines.append(f"  measured lengths: mean {r['length_mean']:.0f}, median {r['length_p50']:.0f}, p95 "
                     f"{r['length_p95']:.0f}, max {r['length_max']} tokens ({r['longer_than_max_len']} of "
                     f"{r['lengths_measured']:,} longer than data.max_len); " + "; ".join(r["lengths_notes"]))
        if r.get("notes_packed"):
            lines.append(f"  note: {r['notes_packed']}")
    if "stage_roofline_s" in r:
        packed = r.get("stage_roofline_s_packed")
        step = r.get("roofline_step_s_packed")
        lines.append(f"  whole stage at the roofline ({r['devices']} x {r['device']}): "
                     f"{format_duration(r['stage_roofline_s'])}"
                     + ("" if "stage_steps_packed" not in r else " padded, " + (
                         "packed: not estimated" if packed is None else f"{format_duration(packed)} packed")
                        + (f" (packed step {step * 1e3:.0f} ms, {r['roofline_bound_packed']}-bound, peak "
                           f"{g(r['peak_bytes_packed'])})" if step is not None and "peak_bytes_packed" in r else "")))
    if r.get("notes_packed_step"):
        lines.append(f"  note: {r['notes_packed_step']}")
    if r.get("vocab_values"):
        lines.append("  largest vocabulary-sized values: " + "; ".join(
            f"{v['dtype']}{v['shape']} {g(v['bytes'])} ({v['hlo_op']})" for v in r["vocab_values"]))
    if r.get("largest_values"):
        lines.append("  largest values (HLO, a buffer may hold several; * = vocabulary-sized):")
        for v in r["largest_values"][:6]:
            star = "*" if v["vocab_sized"] else " "
            lines.append(f"   {star} {g(v['bytes']):>10} {v['dtype']}{v['shape']} {v['hlo_op']} x{v['count']}  "
                         f"{v['op_name'][-60:]}")
    lines += [f"  note: {n}" for n in r.get("notes", [])]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlr_jax.plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML config, e.g. configs/llama3.1-8b.yaml")
    ap.add_argument("--stage", required=True, choices=STAGES)
    ap.add_argument("--mesh", default="data=1,fsdp=8,tensor=1", help="mesh shape (explicit sizes)")
    ap.add_argument("--device", default="h100", choices=sorted(TARGETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    ap.add_argument("--search", action="store_true", help="try remat / grad_accum / mesh shapes; print the best")
    ap.add_argument("--json", action="store_true", help="JSON output")
    ap.add_argument("--refresh-lengths", action="store_true",
                    help="textsft / align / sft: measure the data's sequence lengths again instead of reading them "
                         "from the cache (dlr_jax/plan/lengths.py)")
    ap.add_argument("--no-lengths", action="store_true",
                    help="textsft / align / sft: do not read the data for its lengths (no packed totals)")
    a = ap.parse_args(argv)
    try:
        shape = parse_mesh_spec(a.mesh)
    except ValueError as e:
        ap.error(f"--mesh {a.mesh!r}: expected data=N,fsdp=N,tensor=N ({e})")
    if any(shape[k] < 1 for k in MESH_AXES):  # the config's `-1` / `0` (all the devices) means nothing here
        ap.error(f"--mesh {a.mesh!r}: a plan's mesh is explicit, every size >= 1 (-1 and 0 mean \"the devices "
                 "present\" in a run's config; a plan has none): e.g. data=1,fsdp=8,tensor=1")
    if a.search and not math.isfinite(TARGETS[a.device].peak_flops):
        ap.error(f"--search ranks plans by their roofline step time, and --device {a.device} has no roofline "
                 "(no peak FLOP/s or bandwidth): search for h100, h200 or tpu-v5p, or plan one shape without "
                 "--search")
    try:
        return _run(a, shape)
    # a bad config, a checkpoint file it names that is missing or unreadable, or no compiler for the target: say
    # so, no traceback
    except (ConfigError, ConversionError, FileNotFoundError, TargetUnavailable) as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2


def measured_lengths(cfg: Config, stage: str, *, refresh: bool = False,
                     skip: bool = False) -> tuple[Lengths | None, str | None]:
    """(textsft / align / sft: the stage's measured sequence lengths, cached; else None, why packed totals are left
    out)."""
    from dlr_jax.plan.lengths import stage_lengths

    if skip or stage not in PACKED_STAGES:
        return None, None
    try:
        return stage_lengths(cfg, stage, refresh=refresh), None
    except (OSError, ValueError) as e:  # the data is not on this machine, or does not read
        return None, (f"packed totals left out: the training data's lengths could not be measured "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")


def _run(a: argparse.Namespace, shape: dict[str, int]) -> int:
    cfg = load_config(a.config, a.overrides)
    target = TARGETS[a.device]
    lengths, skipped = measured_lengths(cfg, a.stage, refresh=a.refresh_lengths, skip=a.no_lengths)
    if skipped:
        print(f"note: {skipped}", file=sys.stderr)
    if a.search:
        best, tried = search(cfg, a.stage, target, math.prod(shape[k] for k in MESH_AXES), lengths)
        if a.json:
            print(json.dumps({"best": best, "tried": tried}, default=float))
        else:
            for r in tried:
                if "error" in r:
                    print(f"  {r['mesh']} remat={r['remat']} accum={r['grad_accum']}: {r['error']}")
                else:
                    print(f"  {r['mesh']} remat={r['remat']} accum={r['grad_accum']}: peak "
                          f"{r.get('peak_bytes', 0) / (1 << 30):.1f} GiB, {r.get('roofline_step_s', 0) * 1e3:.1f} ms"
                          f"{'' if r.get('fits') else ' (does not fit)'}")
            print("best:\n" + (format_plan(best) if best else "  nothing fits"))
        return 0 if best else 1
    r = plan_once(cfg, a.stage, target, shape, lengths)
    if skipped:
        r["notes"].append(skipped)
    print(json.dumps(r, default=float) if a.json else format_plan(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
