"""One GRPO step: dlr_jax against TRL's `GRPOTrainer` and tunix's `GRPOLearner` (`--only grpo_peers`).

    python -m dlr_jax.bench --only grpo_peers [--peers-size small] [--peers-mu 1,4] [--peers-dir .peers]

The same workload for all three: one random Llama saved once with `transformers` `save_pretrained`
(and a word-level tokenizer whose words are the token ids, so a prompt's text tokenizes to exactly
its ids), the same P prompts x G completions of exactly N new tokens (no EOS stop), T = 1, a
reference model with beta = 1e-3, the same zero-cost reward, one minibatch of all P x G rollouts per
optimizer step and mu optimizer steps per GRPO step (mu = 1 and mu = 4), AdamW with a constant
learning rate, fp32. Each framework runs in its own process (`grpo_ours.py` here; `peer_trl.py` and
`peer_tunix.py` under their own virtual environments, `make peers`), speaking `peer_protocol`; the
steps are interleaved round-robin (framework by framework within each round), so a busy machine
slows them alike. The first step compiles / warms up and is reported apart; medians over the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.bench import common
from dlr_jax.bench import peer_protocol as protocol
from dlr_jax.bench.workers import Worker

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("dlr_jax", "TRL", "tunix")
PEER_VENVS = {"TRL": "trl", "tunix": "tunix"}  # framework -> folder under --peers-dir
# `make peers` creates them in the checkout's .peers/ (DLR_PEERS_DIR elsewhere)
DEFAULT_PEERS_DIR = Path(os.environ.get("DLR_PEERS_DIR") or Path(__file__).resolve().parents[2] / ".peers")
PHASES = protocol.PHASES


# ----------------------------------------------------------------------------------------------
# The workload.


def save_tokenizer(vocab: int, out_dir: Path, pad_id: int = 0) -> None:
    """A word-level HF tokenizer over `vocab` words: id 0 is `<pad>` (also EOS), id i is `t{i}`, so
    `" ".join(f"t{i}" ...)` encodes to exactly those ids, with no special tokens added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {("<pad>" if i == pad_id else f"t{i}"): i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<pad>",
                            unk_token="<pad>").save_pretrained(out_dir)


def prompt_text(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def build_workload(out_dir: Path, size: common.Size, *, mu: int, steps: int, prompts: int = 8, group: int = 8,
                   new_tokens: int = 64, prompt_len: int = 16, beta: float = 1e-3, lr: float = 1e-5,
                   seed: int = 0, hf_dir: Path | None = None, device: str = "cpu",
                   unstack_layers: str = "auto") -> dict[str, Any]:
    """The workload every worker reads. Writes the random Llama + tokenizer to `out_dir` unless
    `hf_dir` already holds them (one model for every mu). `device`: "cpu" or "gpu", for all three.
    `unstack_layers`: our rollouts' decode loop (`sampling.unstack_layers`; the peers have no such choice)."""
    if hf_dir is None:
        from dlr_jax.bench.sampling import build_hf_llama

        hf_dir = out_dir
        build_hf_llama(size, hf_dir, seed)
        save_tokenizer(size.vocab, hf_dir)
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, size.vocab, (prompts, prompt_len)).tolist()
    return {"hf_dir": str(hf_dir), "prompts": ids, "prompt_texts": [prompt_text(p) for p in ids], "group": group,
            "new_tokens": new_tokens, "temperature": 1.0, "mu": mu, "beta": beta, "epsilon": 0.2, "lr": lr,
            "seed": seed, "steps": steps, "pad_id": 0, "eos_id": 0, "rope_theta": 500000.0,
            "model": size.describe(), "device": device, "unstack_layers": unstack_layers}


def worker_env(device: str) -> dict[str, str]:
    """Environment for every worker. On a GPU: JAX allocates as it goes (two JAX workers share the card;
    by default each would claim 75 % of its memory at start) and multiplies fp32 matrices in full fp32
    as PyTorch does by default (JAX's default on a GPU is TF32). On a CPU: JAX stays on the CPU."""
    if device == "gpu":
        # JAX_PLATFORMS=cuda: a worker that cannot reach the GPU fails instead of timing the CPU under a GPU title
        return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_DEFAULT_MATMUL_PRECISION": "float32",
                "JAX_PLATFORMS": "cuda"}
    return {"JAX_PLATFORMS": "cpu"}


def worker_command(framework: str, workload: Path, peers_dir: Path) -> tuple[list[str] | None, str]:
    """(argv, "") to start a framework's worker, or (None, why it cannot run here)."""
    if framework == "dlr_jax":
        return [sys.executable, "-m", "dlr_jax.bench.grpo_ours", str(workload)], ""
    python = peers_dir / PEER_VENVS[framework] / "bin" / "python"
    if not python.is_file():
        return None, f"no venv at {python.parent.parent} (`make peers` creates it)"
    script = HERE / f"peer_{PEER_VENVS[framework]}.py"
    return [str(python), str(script), str(workload)], ""


# ----------------------------------------------------------------------------------------------
# Workers.


@dataclasses.dataclass
class Side:
    """One framework at one mu: its READY payload and STEP records (the warm-up step first)."""

    framework: str
    mu: int
    steps: list[dict[str, float]] = dataclasses.field(default_factory=list)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    error: str = ""

    def med(self, key: str = "total") -> float:
        return statistics.median(s[key] for s in self.steps[1:])

    @property
    def ok(self) -> bool:
        return not self.error and len(self.steps) >= 2


@dataclasses.dataclass
class PeersResult:
    workload: dict[str, Any]
    sides: list[Side]
    loads: list[float]  # 1-minute load average before every round
    update_flops: float | None = None  # of one optimizer step (update_flops)
    gemm: dict[str, float] = dataclasses.field(default_factory=dict)  # host fp32 GEMM GFLOP/s (CPU runs)

    def side(self, framework: str, mu: int) -> Side | None:
        return next((s for s in self.sides if s.framework == framework and s.mu == mu), None)


def bench_grpo_peers(size: common.Size, *, mus: tuple[int, ...] = (1, 4), steps: int = 3, peers_dir: Path =
                     DEFAULT_PEERS_DIR, frameworks: tuple[str, ...] = FRAMEWORKS, log: Callable[[str], None] = print,
                     **workload_kw: Any) -> PeersResult:
    """1 warm-up + `steps` GRPO steps per framework and mu, interleaved round-robin."""
    sides: list[Side] = []
    loads: list[float] = []
    # the host's GEMM rate, measured before any worker starts (an idle machine), at the TRL worker's threads
    gemm = {}
    if workload_kw.get("device", "cpu") == "cpu":
        threads = common.cpu_threads()
        rates = common.matmul_gflops([threads], n=2048)
        gemm = {"XLA": rates["xla"], "torch": rates[f"torch{threads}"]}
    if gemm:
        log("grpo_peers: fp32 GEMM 2048^3: " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in gemm.items()))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf_dir = root / "model"
        work: dict[str, Any] = {}
        for mu in mus:
            work = build_workload(hf_dir, size, mu=mu, steps=1 + steps,
                                  hf_dir=hf_dir if (hf_dir / "config.json").is_file() else None, **workload_kw)
            path = root / f"workload_mu{mu}.json"
            protocol.write_workload(path, work)
            workers: dict[str, Worker] = {}
            for fw in frameworks:
                side = Side(fw, mu)
                sides.append(side)
                argv, why = worker_command(fw, path, peers_dir)
                if argv is None:
                    side.error = why
                    log(f"grpo_peers: {fw} skipped: {why}")
                    continue
                log(f"grpo_peers: mu={mu}: starting {fw}")
                w = Worker(fw, argv, root / f"{fw}_mu{mu}.log", log, env=worker_env(work["device"]))
                try:
                    ready = w.expect(protocol.READY)
                    side.versions, side.notes = ready.get("versions", {}), ready.get("notes", [])
                    workers[fw] = w
                except RuntimeError as e:
                    side.error = str(e).splitlines()[-1][:300]
                    log(f"grpo_peers: {fw} failed to start: {e}")
                    w.close()
            for r in range(1 + steps):
                loads.append(common.load_average())
                for fw, w in list(workers.items()):
                    side = next(s for s in sides if s.framework == fw and s.mu == mu)
                    try:
                        rec = w.step()
                    except RuntimeError as e:
                        side.error = str(e).splitlines()[-1][:300]
                        log(f"grpo_peers: {fw} failed at step {r}: {e}")
                        w.close()
                        del workers[fw]
                        continue
                    side.steps.append(rec)
                    log(f"grpo_peers: mu={mu} round {r} {fw}: " + json.dumps({k: round(v, 3) for k, v in rec.items()}))
            for w in workers.values():
                w.close()
        loads.append(common.load_average())
    rows = len(work["prompts"]) * work["group"]
    flops = update_flops(size, rows, len(work["prompts"][0]) + work["new_tokens"])
    return PeersResult(work, sides, loads, flops, gemm)


def update_flops(size: common.Size, sequences: int, seq_len: int) -> float:
    """FLOPs of one optimizer step's forward + backward over `sequences` rows of `seq_len` tokens (the
    teacher-forced policy pass every framework's GRPO loss needs; the optimizer's own FLOPs are negligible)."""
    from dlr_jax.plan.flops import dense_lm_flops

    return dense_lm_flops(common.model_config(size), sequences * seq_len, seq_len)


# ----------------------------------------------------------------------------------------------
# Report.


def render_section(res: PeersResult, command: str, info: dict[str, str], *, allow_load: bool = False,
                   start_load: float | None = None) -> str:
    w = res.workload
    # Gate on the load before the first step: during the run the 1-minute average counts the
    # benchmark's own threads (a framework step keeps both cores busy, reading ~2 by itself).
    # the gate: the load before any benchmark of this run (the CLI's), else before our first round
    refusal = common.ratio_refusal([start_load] if start_load is not None else res.loads[:1], allow_load)
    on_gpu = w.get("device") == "gpu"
    gpu_note = " matmuls (no TF32) on the GPU" if on_gpu else ""
    title = "GRPO step on a GPU: dlr_jax vs TRL and tunix" if on_gpu else "GRPO step: dlr_jax vs TRL and tunix"
    lines = common.header(title, command, info) + [
        f"Workload: random Llama ({w['model']}), fp32{gpu_note}, saved once with `transformers` and loaded by all "
        "three; "
        f"{len(w['prompts'])} prompts of {len(w['prompts'][0])} tokens x G = {w['group']} completions of exactly "
        f"{w['new_tokens']} new tokens (no EOS stop), T = {w['temperature']:g}, beta = {w['beta']:g} with a reference "
        f"model, a zero-cost token reward, one minibatch of all {len(w['prompts']) * w['group']} rollouts per "
        f"optimizer step, mu optimizer steps per GRPO step, AdamW lr {w['lr']:g} constant. Each framework in its own "
        "process; steps interleaved round-robin; median of the steps after one warm-up step. Load average before each "
        "round (the first before any work; the later ones include this benchmark's own threads): "
        + ", ".join(f"{x:.2f}" for x in res.loads) + ".",
        "",
        "| mu | framework | s / GRPO step | generate | score (old + ref) | rewards | update | update GFLOP/s | "
        "dlr_jax faster by | warm-up step s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mu in sorted({s.mu for s in res.sides}):
        ours = res.side("dlr_jax", mu)
        for fw in FRAMEWORKS:
            s = res.side(fw, mu)
            if s is None:
                continue
            if not s.ok:
                lines.append(f"| {mu} | {fw} | not run: {s.error or 'no timed step'} | | | | | | | |")
                continue
            if fw == "dlr_jax":
                ratio = "—"
            elif ours is None or not ours.ok:
                ratio = "n/a"
            else:
                ratio = refusal and "(not written)" or f"**{s.med() / ours.med():.2f}x**"
            d = 3 if on_gpu else 2  # GPU steps take tens of milliseconds
            lines.append(f"| {mu} | {fw} | {s.med():.{d}f} | " + " | ".join(f"{s.med(p):.{d}f}" for p in PHASES)
                         + f" | {_rate(res, s)} | {ratio} | {s.steps[0]['total']:.1f} |")
    lines.append("")
    lines += _where_the_time_goes(res)
    if refusal:
        lines += [f"Ratios {refusal}.", ""]
    lines.append("Versions and settings that could not be matched:")
    lines.append("")
    seen: set[str] = set()
    for s in res.sides:
        if s.framework in seen or not s.versions:
            continue
        seen.add(s.framework)
        vers = ", ".join(f"{k} {v}" for k, v in s.versions.items() if k != "framework")
        lines.append(f"- {s.framework} ({vers}): " + ("; ".join(s.notes) or "—") + ".")
    return "\n".join(lines) + "\n"


def _rate(res: PeersResult, s: Side) -> str:
    """GFLOP/s of a side's update phase (mu optimizer steps), or "—" without the FLOP count."""
    if not res.update_flops or s.med("update") <= 0:
        return "—"
    return f"{res.update_flops * s.mu / s.med('update') / 1e9:.0f}"


def _where_the_time_goes(res: PeersResult) -> list[str]:
    """The roofline paragraph: the update's FLOPs, the host's GEMM rate, and the update rate a 2x-TRL step
    would need given our other phases (at the largest mu measured)."""
    if not res.update_flops:
        return []
    mu = max(s.mu for s in res.sides)
    ours, trl = res.side("dlr_jax", mu), res.side("TRL", mu)
    text = (f"Where the time goes: one optimizer step of the update is {res.update_flops / 1e9:.1f} GFLOP "
            "(forward + backward of the policy over every rollout token, counted analytically: "
            "`dlr_jax.plan.flops.dense_lm_flops`); the update column's GFLOP/s is that times mu over the phase's "
            "seconds.")
    if res.gemm:
        text += (" This host's fp32 GEMM ([2048, 2048] x [2048, 2048], best of 5, measured before the workers "
                 "started): "
                 + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in res.gemm.items()) + ".")
    if ours and ours.ok and trl and trl.ok:
        target = trl.med() / 2
        rest = ours.med() - ours.med("update")
        if target > rest:
            need = res.update_flops * mu / (target - rest) / 1e9
            share = f" ({100 * need / res.gemm['XLA']:.0f} % of XLA's GEMM rate)" if "XLA" in res.gemm else ""
            text += (f" At mu = {mu}, a step 2x faster than TRL's takes {target:.2f} s; with our other phases "
                     f"({rest:.2f} s) the update would have to run at {need:.0f} GFLOP/s{share}.")
        else:
            text += (f" At mu = {mu}, a step 2x faster than TRL's takes {target:.2f} s, less than our phases other "
                     f"than the update already take ({rest:.2f} s).")
    return [text, ""]


# ----------------------------------------------------------------------------------------------
# CLI hooks (`python -m dlr_jax.bench --only grpo_peers`).


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--peers-size", choices=sorted(common.SIZES), default="small",
                    help="grpo_peers: model size of the shared random Llama")
    ap.add_argument("--peers-mu", default="1,4", help="grpo_peers: comma-separated inner epochs (mu) to measure")
    ap.add_argument("--peers-dir", type=Path, default=DEFAULT_PEERS_DIR,
                    help="grpo_peers: folder holding the trl/ and tunix/ venvs (`make peers`)")
    ap.add_argument("--peers-device", choices=("cpu", "gpu"), default="cpu",
                    help="grpo_peers: where all three run (gpu writes its own section, grpo_peers_gpu)")
    ap.add_argument("--peers-unstack", choices=("auto", "on", "off"), default="auto",
                    help="grpo_peers: dlr_jax's rollout decode loop (sampling.unstack_layers; auto = unstacked on a "
                         "CPU, the layer scan on a GPU)")
    ap.add_argument("--peers-only", default=",".join(FRAMEWORKS),
                    help=f"grpo_peers: comma-separated subset of {','.join(FRAMEWORKS)}")


def parse_mus(spec: str) -> tuple[int, ...]:
    mus = tuple(int(x) for x in spec.split(",") if x.strip())
    if not mus or min(mus) < 1:
        raise ValueError(f"--peers-mu needs positive integers like 1,4, got {spec!r}")
    return mus


def check_arguments(args: argparse.Namespace) -> str | None:
    try:
        parse_mus(args.peers_mu)
    except ValueError as e:
        return str(e)
    bad = [f for f in args.peers_only.split(",") if f not in FRAMEWORKS]
    return f"--peers-only: unknown framework(s) {bad}; choose from {FRAMEWORKS}" if bad else None


def section_name(args: argparse.Namespace) -> str:
    """The BENCHMARKS.md section a run writes: the GPU comparison keeps its own."""
    return "grpo_peers_gpu" if args.peers_device == "gpu" else "grpo_peers"


def run_section(args: argparse.Namespace, command: str, info: dict[str, str],
                log: Callable[[str], None] = print) -> str:
    err = check_arguments(args)
    if err:
        raise ValueError(err)
    res = bench_grpo_peers(common.SIZES[args.peers_size], mus=parse_mus(args.peers_mu), steps=args.repeats,
                           peers_dir=args.peers_dir, frameworks=tuple(args.peers_only.split(",")), log=log,
                           device=args.peers_device, unstack_layers=args.peers_unstack)
    return render_section(res, command, info, allow_load=getattr(args, "allow_load", False),
                          start_load=getattr(args, "start_load", None))  # None: gate on its first round's load
