"""One GPU, one command: the SFT step and GRPO at a real model's shape, against PyTorch (`make bench-gpu`).

    python -m dlr_jax.bench.gpu --out BENCHMARKS.md          (an H100 / H200: section `gpu`)
    python -m dlr_jax.bench.gpu --dry-run [--out F]           (the same code path on the CPU at a toy size)

The case is a Llama-3.2-1B-shaped model with random weights (hidden 2048, 16 layers, 32 heads / 8 KV heads,
MLP 8192, vocabulary 128,256, tied embeddings), bf16 compute over fp32 master weights, trained on packed rows
of 2,048 tokens (segments of GSM8K-Aug-like lengths, each with its prompt masked out of the loss, as the
pipeline packs them: `data.pipeline`, `data.packing`):

- ours: `training.trainer.Trainer`'s step with `stages.common.lm_loss` (AdamW, clip 1.0), timed from the host
  batch to the loss as a float; tokens/s and MFU from the FLOPs counted on the step's program (`plan.flops`)
  over the GPU's dense bf16 peak (`plan.targets`); beside them what the planner says of that compiled step
  (`plan.cli.device_estimate`: XLA's peak memory, the roofline step time) and the memory the device measured;
  then the rl stage's GRPO step (`bench.grpo_ours`: rollout, scoring, mu updates) with G = 32 rollouts of one
  prompt: rollout tokens/s and update tokens/s;
- PyTorch: `transformers`' LlamaForCausalLM with SDPA attention, fused AdamW and bf16 autocast over fp32
  master weights, on the same batch (packed rows as `transformers` takes them: position ids restarting at
  every segment, no attention mask, so its mask is block-diagonal; a forward check on the first row shows
  it), its own random weights of the same shape.

Each side runs in its own process, one after the other (`gpu_side.py`): on a GPU each framework would
otherwise claim the other's memory. XLA's persistent compilation cache is on (`core.compile_cache`), so a
second run skips most of the compile. The dry run (`--dry-run`, `make bench-gpu BENCH_GPU_DRY=1`) runs
every step of this on the CPU at a toy size and prints the section (writing it only to an explicit --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.bench import common
from dlr_jax.bench.gpu_side import RESULT, median
from dlr_jax.bench.workers import Worker

SECTION = "gpu"


@dataclasses.dataclass(frozen=True)
class GpuCase:
    name: str
    model: dict[str, Any]  # ModelConfig fields
    batch: int  # packed rows a step
    seq: int  # tokens a row
    mean_len: int  # mean segment length (tokens)
    repeats: int  # timed SFT steps after the first
    grpo: dict[str, int]  # prompts, group, prompt_len, new_tokens, mu, steps (timed, after the first)


LLAMA_1B = dict(vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                num_kv_heads=8, head_dim=64, rope_theta=500_000.0, tie_embeddings=True, dtype="bfloat16",
                param_dtype="float32", remat="none")

CASES = {
    # A DLR-SFT row of GSM8K-Aug is ~80 tokens; 2,048-token rows hold ~25 of them.
    "llama-1b": GpuCase("llama-1b", LLAMA_1B, batch=8, seq=2048, mean_len=80, repeats=10,
                        grpo=dict(prompts=1, group=32, prompt_len=128, new_tokens=256, mu=4, steps=2)),
    "toy": GpuCase("toy", dict(LLAMA_1B, vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                               num_heads=4, num_kv_heads=2, head_dim=16),
                   batch=2, seq=128, mean_len=24, repeats=2,
                   grpo=dict(prompts=1, group=4, prompt_len=8, new_tokens=8, mu=2, steps=1)),
}


def packed_batch(case: GpuCase, seed: int = 0) -> dict[str, np.ndarray]:
    """`case.batch` rows of `case.seq` tokens in the pipeline's packed layout (`data.pipeline.BATCH_KEYS`):
    segments of lengths around `case.mean_len` (a quarter to twice it) packed first-fit in order, each with its
    first ~40 % a prompt (not a target); random token ids; the rest of a row is padding (segment 0)."""
    rng = np.random.default_rng(seed)
    vocab, t = case.model["vocab_size"], case.seq
    out = {k: np.zeros((case.batch, t), np.int32) for k in ("tokens", "loss_mask", "segment_ids", "positions")}
    lo, hi = max(4, case.mean_len // 4), 2 * case.mean_len
    for r in range(case.batch):
        n, s = 0, 0
        while True:
            m = int(rng.integers(lo, hi + 1))
            if n + m > t:
                break
            s += 1
            out["tokens"][r, n:n + m] = rng.integers(2, vocab, m)
            out["segment_ids"][r, n:n + m] = s
            out["positions"][r, n:n + m] = np.arange(m)
            out["loss_mask"][r, n + int(0.4 * m):n + m] = 1
            n += m
    return out


def _worker_env(dry_run: bool) -> dict[str, str]:
    """One device for a dry run's workers (a test session's fake CPU devices would split the toy batch)."""
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if dry_run:
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
        env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags)}
    return env


def run_side(side: str, root: Path, env: dict[str, str], log: Callable[[str], None]) -> dict[str, Any]:
    """One side's RESULT, or {"error": ...} (the section says what failed; the other side still runs)."""
    t0 = time.perf_counter()
    w = Worker(f"gpu {side}", [sys.executable, "-m", "dlr_jax.bench.gpu_side", side, str(root)],
               root / f"{side}.log", log, env=env)
    try:
        out = w.expect(RESULT)
    except RuntimeError as e:
        out = {"error": str(e).splitlines()[0][:600]}
    finally:
        w.close()
    out["wall_s"] = time.perf_counter() - t0
    log(f"gpu[{side}]: {out.get('error') or 'done'} in {out['wall_s']:.0f} s")
    return out


def run_benchmark(case: GpuCase, *, dry_run: bool, skip_torch: bool = False,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.perf_counter()
    batch = packed_batch(case)
    spec = {"model": case.model, "batch": case.batch, "seq": case.seq, "repeats": case.repeats, "grpo": case.grpo,
            "device": "cpu" if dry_run else "gpu"}
    env = _worker_env(dry_run)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "spec.json").write_text(json.dumps(spec))
        np.savez(root / "batch.npz", **batch)
        ours = run_side("ours", root, env, log)
        torch = {"error": "not run (--skip-torch)"} if skip_torch else run_side("torch", root, env, log)
    return {"case": case, "batch": batch, "ours": ours, "torch": torch, "dry_run": dry_run,
            "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------------------------
# Report.


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / (1 << 30):.2f} GiB"


def _sft_numbers(side: dict[str, Any], tokens: int, flops: float | None, peak: float | None) -> dict[str, str]:
    if "error" in side:
        return {}
    s = side["sft"]
    t = median(s["step_s"])
    mfu = f"{100 * flops / t / peak:.1f} %" if flops and peak and t > 0 else "-"
    return {"tokens/s (all row tokens; median)": f"**{tokens / t:,.0f}**", "seconds per step (median)": f"{t:.4f}",
            "seconds per step (all)": ", ".join(f"{x:.4f}" for x in s["step_s"]),
            "MFU (counted FLOPs / step time / bf16 peak)": mfu,
            "first step s (ours: + compile; theirs: + warm-up)": f"{s['first_s']:.2f}",
            "peak memory, measured by the framework": _gib(side.get("peak_bytes_measured")),
            "loss at the first / last step": f"{s['losses'][0]:.4f} / {s['losses'][-1]:.4f}"}


def render(res: dict[str, Any], command: str, info: dict[str, str]) -> str:
    case: GpuCase = res["case"]
    batch, ours, theirs = res["batch"], res["ours"], res["torch"]
    m = case.model
    tokens = case.batch * case.seq
    real = int((batch["segment_ids"] > 0).sum())
    segments = int(batch["segment_ids"].max(axis=1).sum())
    flops, peak = ours.get("flops"), ours.get("peak_flops")
    title = "GPU: SFT step and GRPO at Llama-3.2-1B's shape, vs PyTorch" + (" (DRY RUN, CPU, toy size)"
                                                                           if res["dry_run"] else "")
    lines = common.header(title, command, info)
    lines += [
        f"Model: random weights, hidden {m['hidden_size']}, {m['num_layers']} layers, {m['num_heads']} heads / "
        f"{m['num_kv_heads']} KV heads, MLP {m['intermediate_size']}, vocabulary {m['vocab_size']:,}, tied "
        f"embeddings ({(ours.get('params') or 0) / 1e6:,.1f}M params); {m['dtype']} compute, {m['param_dtype']} "
        f"master weights, AdamW (lr 1e-4 constant, weight decay 0.01, clip 1.0). Batch: {case.batch} packed rows "
        f"of {case.seq:,} tokens = {tokens:,} tokens, {segments} segments ({real:,} real tokens, "
        f"{100 * real / tokens:.0f} %), prompts masked. Median of {case.repeats} timed steps after the first.",
        "",
    ]
    a = _sft_numbers(ours, tokens, flops, peak)
    b = _sft_numbers(theirs, tokens, flops, peak)
    torch_label = (f"PyTorch {theirs.get('torch', '')} + transformers {theirs.get('transformers', '')} (SDPA, "
                   f"AdamW {theirs.get('opt', '')}, bf16 autocast)")
    lines += [f"| SFT step | dlr_jax (jax {ours.get('jax', '')}) | {torch_label} |", "|---|---|---|"]
    for key in a or b:
        lines.append(f"| {key} | {a.get(key, '-')} | {b.get(key, '-')} |")
    if a and b:
        ratio = median(theirs["sft"]["step_s"]) / median(ours["sft"]["step_s"])
        lines.append(f"| speed-up of ours | **{ratio:.2f}x** | - |")
    lines.append("")
    for name, side in (("dlr_jax", ours), ("PyTorch", theirs)):
        if "error" in side:
            lines.append(f"{name}: {side['error']}")
    if "plan" in ours:
        p = ours["plan"]
        measured = median(ours["sft"]["step_s"]) if "sft" in ours else float("nan")
        roof = p.get("roofline_step_s")
        roof_txt = (f"roofline {roof:.4f} s ({p.get('roofline_bound')}-bound, MFU <= "
                    f"{100 * (p.get('roofline_mfu') or 0):.0f} %) against {measured:.4f} s measured "
                    f"({measured / roof:.1f}x the roofline)" if roof else
                    "no roofline (no peak FLOP/s on record for this device)")
        lines += ["", "The planner on this compiled step (`plan.cli.device_estimate`, what `python -m dlr_jax.plan` "
                  f"prints): {flops or 0:.3e} FLOPs a step counted on its program; {roof_txt}; XLA's peak memory "
                  f"{_gib(p.get('peak_bytes'))} (arguments {_gib(p.get('argument_bytes'))}, temporaries "
                  f"{_gib(p.get('temp_bytes'))}) against {_gib(ours.get('peak_bytes_measured'))} measured "
                  f"(`memory_stats()` peak) of {_gib(ours.get('bytes_limit'))}. Compiling it again took "
                  f"{ours.get('estimate_compile_s', 0):.1f} s (compilation cache: "
                  f"{ours.get('compile_cache') or 'off'})."]
    if "packing_check" in theirs:
        packed, apart = theirs["packing_check"]
        lines += ["", f"PyTorch's packed rows: the first row's loss packed {packed:.5f}, its segments one a row "
                  f"{apart:.5f} (bf16 autocast; equal up to rounding when the mask is block-diagonal)."]
    g = ours.get("grpo")
    if isinstance(g, dict) and g.get("steps"):
        gc = case.grpo
        med = {k: median([s[k] for s in g["steps"]]) for k in ("generate", "score", "update", "total")}
        gen_tokens = g["rows"] * gc["new_tokens"]
        upd_tokens = gc["mu"] * g["rows"] * g["seq"]
        score_tokens = 2 * g["rows"] * g["seq"]
        lines += ["", f"GRPO (the rl stage's `GRPOStep`, ours only): G = {gc['group']} rollouts of a "
                  f"{gc['prompt_len']}-token prompt + {gc['new_tokens']} new tokens, mu = {gc['mu']} updates of "
                  f"{g['rows']} rows each; median of {len(g['steps'])} steps after the first "
                  f"({g['first']['total']:.1f} s with its compiles).", "",
                  "| GRPO | seconds | tokens/s |", "|---|---|---|",
                  f"| rollout (sampling) | {med['generate']:.3f} | **{gen_tokens / med['generate']:,.0f}** generated |",
                  f"| scoring (old + reference log-probs) | {med['score']:.3f} | {score_tokens / med['score']:,.0f} |",
                  f"| update (mu optimizer steps) | {med['update']:.3f} | **{upd_tokens / med['update']:,.0f}** |",
                  f"| whole step | {med['total']:.3f} | - |"]
    elif isinstance(g, dict) and g.get("error"):
        lines += ["", f"GRPO: {g['error']}"]
    lines += ["", f"Wall time of the whole benchmark: {res['wall_s']:.0f} s (ours {ours.get('wall_s', 0):.0f} s, "
              f"PyTorch {theirs.get('wall_s', 0):.0f} s)."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# CLI.


def check_device(dry_run: bool) -> str | None:
    """Why this machine cannot run the real benchmark (None when it can); the dry run runs anywhere."""
    if dry_run:
        return None
    import jax

    if jax.default_backend() != "gpu":
        return (f"JAX's backend is {jax.default_backend()!r}, not a GPU: install jax with CUDA "
                "(pip install -U 'jax[cuda12]') and leave JAX_PLATFORMS unset, or pass --dry-run")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlr_jax.bench.gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="markdown file whose `gpu` section to write (default BENCHMARKS.md; a dry run writes "
                         "only to an --out given)")
    ap.add_argument("--dry-run", action="store_true", default=os.environ.get("BENCH_GPU_DRY", "") not in ("", "0"),
                    help="the same code path on the CPU at a toy size (also BENCH_GPU_DRY=1)")
    ap.add_argument("--case", choices=sorted(CASES), default=None, help="default: llama-1b, toy for a dry run")
    ap.add_argument("--skip-torch", action="store_true", help="run our side only")
    ap.add_argument("--batch", type=int, default=None, help="packed rows a step (default: the case's, 8)")
    ap.add_argument("--remat", choices=("none", "dots", "full"), default=None,
                    help="our side's model.remat (default none; dots / full where memory is short)")
    ap.add_argument("--attention", choices=("auto", "xla", "cudnn"), default=None,
                    help="our side's model.attention (default auto: cuDNN flash attention for bf16 on a GPU)")
    a = ap.parse_args(argv)
    if (why := check_device(a.dry_run)) is not None:
        ap.error(why)
    if a.batch is not None and a.batch < 1:
        ap.error(f"--batch must be >= 1, got {a.batch}")
    case = CASES[a.case or ("toy" if a.dry_run else "llama-1b")]
    model = {k: v for k, v in (("remat", a.remat), ("attention", a.attention)) if v is not None}
    case = dataclasses.replace(case, batch=a.batch or case.batch, model=case.model | model)
    command = " ".join(["python -m dlr_jax.bench.gpu", *(argv if argv is not None else sys.argv[1:])])
    if argv is None and os.environ.get("MAKELEVEL"):
        command = f"make bench-gpu  (= {command})"
    res = run_benchmark(case, dry_run=a.dry_run, skip_torch=a.skip_torch)
    body = render(res, command, common.machine_info())
    out = a.out if a.out is not None else (None if a.dry_run else Path("BENCHMARKS.md"))
    if out is not None:
        common.write_section(out, SECTION, body)
        print(f"gpu: wrote section `{SECTION}` to {out}")
    print(body)
    failed = [s for s in ("ours", "torch") if "error" in res[s] and not (s == "torch" and a.skip_torch)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
