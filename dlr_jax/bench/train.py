"""SFT step throughput: `dlr_jax.training.trainer.Trainer` against a PyTorch `transformers` reference.

    python -m dlr_jax.bench --out BENCHMARKS.md --only train [--train-cases demo,medium]

Both sides train the *same* weights (a random HF `LlamaForCausalLM` is saved and imported with
`dlr_jax.convert.load_hf`) on the *same* SFT-shaped batch: right-padded rows, a prompt that is not
a target and an answer that is, loss = masked next-token cross-entropy averaged over the target
tokens (`dlr_jax.stages.common.lm_loss` on our side, `labels=-100` outside the targets on theirs).
Optimiser on both sides: AdamW (b1 0.9, b2 0.999, eps 1e-8, weight decay 0.01 on matrices only,
constant learning rate) after global-norm gradient clipping at 1.0; theirs is
`torch.optim.AdamW(fused=True)` on CPU. A step is timed from the host batch to the loss as a
Python float on both sides (so each side has finished its work). PyTorch runs at XLA's thread
count and, from the same saved weights, at one thread: on a loaded machine OpenMP can be far
slower with more threads, and the faster PyTorch setting is the reference the verdict uses. Every
side runs in its own process (`train_side.py`; in one process the frameworks slow each other down,
see `workers.py`), their steps interleaved one at a time; since every side starts from the same
weights and sees the same batch, their losses must agree step for step, and the report shows that
they do.

Profile: a forward-only loss (no gradient) on each side, the XLA-counted FLOPs of our compiled step
(`cost_analysis()`), a plain fp32 matmul on each side for what the machine reaches, and the op time
of our step by kind from a `jax.profiler` trace, with the costliest HLO ops named.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import yaml
from flax import nnx

from dlr_jax.bench import common
from dlr_jax.bench.op_profile import describe_op
from dlr_jax.bench.workers import Worker
from dlr_jax.config import ModelConfig, TrainConfig, from_dict

DEMO_CONFIG = common.TINY_CONFIG
DEMO_VOCAB = 896  # the demo's latent LM: 384 text rows + 512 latent rows (tiny.yaml)
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01


@dataclasses.dataclass(frozen=True)
class TrainCase:
    """A model and the batch one optimizer step sees."""

    name: str
    model: ModelConfig
    batch: int
    seq: int
    note: str

    def describe(self) -> str:
        m = self.model
        return (f"hidden {m.hidden_size}, {m.num_layers} layers, {m.num_heads} heads / {m.num_kv_heads} KV "
                f"heads (head_dim {m.head_dim}), MLP {m.intermediate_size}, vocab {m.vocab_size}, "
                f"{'tied' if m.tie_embeddings else 'untied'} embeddings")


def demo_model_config(path: Path = DEMO_CONFIG, vocab: int = DEMO_VOCAB) -> ModelConfig:
    """The `model:` section of the demo config (only that section is read), at the demo's vocab."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot read the demo config ({e})") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("model"), Mapping):
        raise ValueError(f"{path}:1: expected a top-level mapping with a 'model:' section")
    return dataclasses.replace(from_dict(ModelConfig, data["model"], where=f"{path}: model"), vocab_size=vocab)


CASES = ("tiny", "demo", "small", "medium")


def train_cases() -> dict[str, TrainCase]:
    s = common.SIZES
    return {
        "tiny": TrainCase("tiny", common.model_config(s["tiny"]), 4, 16, "smoke tests only"),
        "demo": TrainCase("demo", demo_model_config(), 32, 112, f"the `model:` section of configs/tiny.yaml, "
                          f"vocab {DEMO_VOCAB}, the demo's SFT batch"),
        "small": TrainCase("small", common.model_config(s["small"]), 16, 128, "the sampling benchmark's small size"),
        "medium": TrainCase("medium", common.model_config(s["medium"]), 8, 256, "the sampling benchmark's medium size"),
    }


def sft_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """An SFT-shaped batch in the pipeline's layout (dlr_jax/data/pipeline.py): each row holds one
    sequence of length in [seq/2, seq], right-padded with 0; its first 1/4-1/2 is the prompt (not a
    target), the rest the answer (targets). All arrays [batch, seq] int32."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(seq // 2, 2), seq + 1, batch)
    prompts = np.array([rng.integers(max(n // 4, 1), max(n // 2, 1) + 1) for n in lengths])
    t = np.arange(seq)[None, :]
    real = t < lengths[:, None]
    return {
        "tokens": np.where(real, rng.integers(1, vocab, (batch, seq)), 0).astype(np.int32),
        "loss_mask": (real & (t >= prompts[:, None])).astype(np.int32),
        "segment_ids": real.astype(np.int32),
        "positions": np.where(real, t, 0).astype(np.int32),
    }


def target_mask(batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """[b, t] bool: token t is a target, by the rule of `lm_loss` (loss_mask set, same segment as
    the token before it, not padding). Column 0 is never a target."""
    seg = batch["segment_ids"]
    m = (batch["loss_mask"][:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    return np.concatenate([np.zeros_like(m[:, :1]), m], axis=1)


# ----------------------------------------------------------------------------------------------
# The two sides.


def build_hf(cfg: ModelConfig, out_dir: Path, seed: int = 0) -> Any:
    """A random HF Llama of `cfg` (HF's own init), saved to `out_dir` in fp32."""
    import torch
    import transformers as tf

    from dlr_jax.convert import hf_config_dict

    tf.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**hf_config_dict(cfg, "float32")))
    model.save_pretrained(out_dir)
    return model


class TorchSFT:
    """The PyTorch reference: the HF model, fused AdamW, the same loss and clipping, run with
    `threads` intra-op threads (set before every call, so two replicas can use different counts)."""

    def __init__(self, model: Any, lr: float, weight_decay: float, grad_clip: float, threads: int):
        import torch

        self.torch, self.threads = torch, threads
        self.model = model.train()
        params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        try:
            self.opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=True)
            self.opt_kind = "fused=True"
        except (RuntimeError, ValueError):  # fused unsupported on this device/version
            self.opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, foreach=True)
            self.opt_kind = "foreach=True (fused is unsupported here)"
        self.params, self.grad_clip = params, grad_clip

    def _inputs(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        t = self.torch
        tokens = t.from_numpy(np.asarray(batch["tokens"], np.int64))
        labels = t.where(t.from_numpy(target_mask(batch)), tokens, t.full_like(tokens, -100))
        return {"input_ids": tokens, "labels": labels, "use_cache": False,
                "attention_mask": t.from_numpy(np.asarray(batch["segment_ids"] > 0, np.int64)),
                "position_ids": t.from_numpy(np.asarray(batch["positions"], np.int64))}

    def step(self, batch: Mapping[str, np.ndarray]) -> float:
        """One optimizer step; the loss as a float (mean over target tokens, before the update)."""
        self.torch.set_num_threads(self.threads)
        self.opt.zero_grad(set_to_none=True)
        loss = self.model(**self._inputs(batch)).loss  # HF: mean CE over labels != -100, shifted
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        self.opt.step()
        return float(loss.detach())

    def forward_loss(self, batch: Mapping[str, np.ndarray]) -> float:
        self.torch.set_num_threads(self.threads)
        with self.torch.no_grad():
            return float(self.model(**self._inputs(batch)).loss)


def our_trainer(model: nnx.Module, workdir: Path, batch_size: int, lr: float, weight_decay: float) -> Any:
    from dlr_jax.stages.common import lm_loss
    from dlr_jax.training.trainer import Trainer

    # Constant learning rate (no warmup, cosine from lr to lr) so the two sides take the same steps.
    cfg = TrainConfig(learning_rate=lr, warmup_ratio=0.0, min_lr_ratio=1.0, weight_decay=weight_decay,
                      grad_clip=1.0, batch_size=batch_size, num_steps=1, progress=False, async_checkpointing=False)
    return Trainer(model, lm_loss, cfg, workdir, name="bench")


def our_forward(trainer: Any) -> Callable[[Mapping[str, np.ndarray]], float]:
    """Forward-only loss (mean over targets) with the trainer's current parameters."""
    key = jax.random.key(0)
    fwd = jax.jit(lambda p, r, b: trainer.loss_fn(nnx.merge(trainer.graphdef, p, r), b, key)[:2])

    def run(batch: Mapping[str, np.ndarray]) -> float:
        total, weight = fwd(trainer.params, trainer.rest, dict(batch))
        return float(total) / max(float(weight), 1.0)

    return run


def step_flops(trainer: Any, batch: Mapping[str, np.ndarray], compile: bool = True) -> tuple[float, float, str]:
    """(XLA-counted FLOPs of one train step, seconds to lower + compile it once more, its optimised
    HLO text). Without `compile`: the FLOPs of the unoptimised lowering, nan seconds, no HLO."""
    t0 = time.perf_counter()
    lowered = trainer.lower_step(batch)
    compiled = lowered.compile() if compile else None
    seconds = time.perf_counter() - t0 if compile else float("nan")
    cost = (compiled or lowered).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", float("nan"))), seconds, compiled.as_text() if compiled else ""


# ----------------------------------------------------------------------------------------------
# The benchmark.

OURS = "ours"
TRAIN, FWD, PROFILE = "TRAIN", "FWD", "PROFILE"  # the answers of a `train_side` worker


def torch_side(threads: int) -> str:
    return f"torch{threads}"


@dataclasses.dataclass(frozen=True)
class TrainStepResult:
    case: TrainCase
    repeats: int
    threads: int  # cores XLA uses; the first PyTorch side uses as many
    sides: tuple[str, ...]  # "ours", then "torch<threads>" for each PyTorch thread count
    opt_kind: str
    batch_tokens: int  # batch x seq, padding included
    real_tokens: int
    target_tokens: int
    step_s: dict[str, list[float]]  # seconds per train step, per repeat
    fwd_s: dict[str, list[float]]  # forward-only loss
    first_s: dict[str, float]  # the first step: (trace + compile +) run
    losses: dict[str, list[float]]  # per step, the warm-up step first
    fwd_loss_gap: float  # |ours - torch| of the forward-only loss on the initial weights
    compile_s: float  # one more lower + compile of our step (nan without the profile)
    step_flops: float  # XLA cost_analysis of our step (of its unoptimised lowering without the profile)
    matmul: dict[str, float]  # side ("xla" for ours) -> fp32 matmul GFLOP/s
    param_count: int
    op_kinds: dict[str, float]  # our step's XLA op seconds by kind (profiler); {} if unavailable
    top_ops: list[tuple[str, float, str, str]]  # (op, seconds per step, result shape, jax op path)
    loads: tuple[float, ...] = ()  # the load average before any work (later ones would count our own threads)

    def med(self, side: str, which: str = "step") -> float:
        return statistics.median((self.step_s if which == "step" else self.fwd_s)[side])

    def tps(self, side: str, tokens: int | None = None) -> float:
        return (self.batch_tokens if tokens is None else tokens) / self.med(side)

    def ratio(self, side: str) -> float:
        """Speed-up of ours over `side` (> 1: ours is faster)."""
        return self.med(side) / self.med(OURS)

    @property
    def best_torch(self) -> str:
        return min(self.sides[1:], key=self.med)

    @property
    def max_loss_gap(self) -> float:
        ours = self.losses[OURS]
        return max(abs(a - b) for s in self.sides[1:] for a, b in zip(ours, self.losses[s], strict=True))


def bench_train(case: TrainCase, *, repeats: int = 5, threads: int | None = None, seed: int = 0,
                lr: float = LEARNING_RATE, profile: bool = True,
                log: Callable[[str], None] = print) -> TrainStepResult:
    """A warm-up step per side, then `repeats` rounds of (an untimed step, a timed step, a forward-
    only loss) per side, all on the same batch, the order reversed every other round. Every side runs in its own process
    (`train_side`; `workers.py` says why), one at a time. PyTorch runs twice, from the same saved
    weights: with as many threads as XLA uses, and with one (on a loaded machine OpenMP's barriers
    can make more threads far slower; the faster of the two is the fair reference). `profile`:
    afterwards compile our step once more for its FLOPs and HLO, and trace 2 more steps for the
    op-time breakdown."""
    loads = (common.load_average(),)
    threads = threads or common.cpu_threads()
    counts = sorted({threads, 1}, reverse=True)
    sides = (OURS, *(torch_side(n) for n in counts))
    batch = sft_batch(case.batch, case.seq, case.model.vocab_size, seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_hf(case.model, root / "hf", seed)
        np.savez(root / "batch.npz", **batch)
        (root / "spec.json").write_text(json.dumps({"batch_size": case.batch, "lr": lr,
                                                    "weight_decay": WEIGHT_DECAY}))
        workers: dict[str, Any] = {}
        try:
            ready = {}
            for s in sides:  # one at a time: a worker's set-up (and our compile) runs alone
                workers[s] = Worker(f"train {s}", [sys.executable, "-m", "dlr_jax.bench.train_side", s, tmp],
                                    root / f"{s}.log", log)
                ready[s] = workers[s].expect("READY")
            fwd_gap = max(abs(ready[OURS]["forward_loss"] - ready[s]["forward_loss"]) for s in sides[1:])
            first_s, losses = {}, {}
            for s in sides:
                r = workers[s].call("step", TRAIN)
                first_s[s], losses[s] = r["seconds"], [r["loss"]]
            log(f"train[{case.name}]: first step " + ", ".join(f"{s} {first_s[s]:.2f}s" for s in sides)
                + f"; loss {losses[OURS][0]:.5f}")
            step_s: dict[str, list[float]] = {s: [] for s in sides}
            fwd_s: dict[str, list[float]] = {s: [] for s in sides}
            for r in range(repeats):  # interleaved so load spikes hit all sides alike
                for s in sides if r % 2 == 0 else sides[::-1]:
                    # An untimed step first: a process's first step after another process ran is slower
                    # than the step after it, however long the pause between them; a training loop runs its
                    # steps back to back.
                    losses[s].append(workers[s].call("step", TRAIN)["loss"])
                    out = workers[s].call("step", TRAIN)
                    step_s[s].append(out["seconds"])
                    losses[s].append(out["loss"])
                    fwd_s[s].append(workers[s].call("fwd", FWD)["seconds"])
                log(f"train[{case.name}]: repeat {r + 1}/{repeats}: step " + ", ".join(
                    f"{s} {step_s[s][-1]:.3f}s" for s in sides) + "; forward " + ", ".join(
                    f"{s} {fwd_s[s][-1]:.3f}s" for s in sides) + f"; loss {losses[OURS][-1]:.5f}")
            prof = workers[OURS].call("profile" if profile else "flops", PROFILE)
        finally:
            for w in workers.values():
                w.close()
    tm = target_mask(batch)
    return TrainStepResult(case, repeats, threads, sides, ready[sides[1]]["opt"], case.batch * case.seq,
                           int((batch["segment_ids"] > 0).sum()), int(tm.sum()), step_s, fwd_s, first_s, losses,
                           fwd_gap, prof["compile_s"], prof["flops"], common.matmul_gflops(counts),
                           ready[OURS]["params"],
                           prof["kinds"], [tuple(t) for t in prof["top"]], loads)


# ----------------------------------------------------------------------------------------------
# Report.


def side_label(res: TrainStepResult, side: str) -> str:
    if side == OURS:
        return f"dlr_jax Trainer (XLA, {res.threads} thread{'s' * (res.threads > 1)})"
    n = int(side.removeprefix("torch"))
    return f"PyTorch ({n} thread{'s' * (n > 1)})"


def render_case(res: TrainStepResult, allow_load: bool = False) -> list[str]:
    """One case's table and text; the speed-ups and the verdict read from them are left out (saying why)
    when the machine was busy before the benchmark started (`common.ratio_refusal`), unless `allow_load`."""
    refusal = common.ratio_refusal(list(res.loads), allow_load)
    c, sides = res.case, res.sides
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    row = lambda name, f: f"| {name} | " + " | ".join(f(s) for s in sides) + " |"
    best = res.best_torch
    gflops = lambda s: f"{res.step_flops / res.med(s) / 1e9:.1f}"
    n_steps = len(res.losses[OURS])
    lines = [
        f"### {c.name}: {c.describe()} ({res.param_count / 1e6:.2f}M params; {c.note})",
        "",
        f"Batch {c.batch} x {c.seq} = {res.batch_tokens:,} tokens ({res.real_tokens:,} real, "
        f"{res.target_tokens:,} targets). Median of {res.repeats} timed steps after one warm-up step; each "
        "timed step follows an untimed one of the same side.",
        "",
        "| | " + " | ".join(side_label(res, s) for s in sides) + " |",
        "|---|" + "---|" * len(sides),
        row("tokens/s, all batch tokens (median)", lambda s: f"**{res.tps(s):,.0f}**"),
        row("target tokens/s (median)", lambda s: f"{res.tps(s, res.target_tokens):,.0f}"),
        row("seconds per step (median)", lambda s: f"{res.med(s):.3f}"),
        row("seconds per step (all repeats)", lambda s: fmt(res.step_s[s])),
        row("speed-up of ours over this side",
            lambda s: "-" if s == OURS else "(not written)" if refusal else f"**{res.ratio(s):.2f}x**"),
        row("first step s (ours: trace + compile + run)", lambda s: f"{res.first_s[s]:.2f}"),
        row("forward-only loss s (median)", lambda s: f"{res.med(s, 'fwd'):.3f}"),
        row("backward + update s (step - forward)", lambda s: f"{res.med(s) - res.med(s, 'fwd'):.3f}"),
        row("GFLOP/s (our step's XLA-counted FLOPs / step time)", gflops),
        row("fp32 1024^3 matmul GFLOP/s, best of 5", lambda s: f"{res.matmul['xla' if s == OURS else s]:.0f}"),
        row(f"loss at step 1 / step {n_steps}", lambda s: f"{res.losses[s][0]:.5f} / {res.losses[s][-1]:.5f}"),
        "",
        (f"Speed-up {refusal} (load average before the benchmark: {res.loads[0]:.2f}). " if refusal else
         f"Speed-up over PyTorch at equal threads ({res.threads}): **{res.ratio(sides[1]):.2f}x**; over the "
         f"faster PyTorch setting, {side_label(res, best)}: **{res.ratio(best):.2f}x** "
         f"(target >= 1.0x: {'met' if res.ratio(best) >= 1 else 'missed'}). ")
        + f"Losses agree: forward on the same "
        f"weights differs by {res.fwd_loss_gap:.1e}, and over {n_steps} steps of each side the largest "
        f"step-for-step gap is {res.max_loss_gap:.1e}.",
        "",
        f"Our step: {res.step_flops / 1e9:.2f} GFLOP by XLA's cost analysis"
        + (f"; one more lower + compile took {res.compile_s:.2f} s (excluded from the timings)."
           if np.isfinite(res.compile_s) else "."),
    ]
    if res.op_kinds:
        total = sum(res.op_kinds.values())
        shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in
                           sorted(res.op_kinds.items(), key=lambda kv: -kv[1]))
        lines += ["", f"Where our step's time goes (XLA CPU op time from a `jax.profiler` trace of 2 steps, "
                  f"{total:.3f} s per step summed over threads): {shares}. Costliest ops:", ""]
        lines += [f"- `{n}` {1e3 * sec:.1f} ms/step, `{shape}` (`{path}`)" for n, sec, shape, path in res.top_ops]
    lines += ["", f"Interpretation: {interpret_train(res)}", ""] if not refusal else [""]
    return lines


def interpret_train(res: TrainStepResult) -> str:
    """One paragraph from the measured numbers: verdict, and where the time goes if we are slower."""
    best = res.best_torch
    r = res.ratio(best)
    fwd_r = res.med(best, "fwd") / res.med(OURS, "fwd")
    bwd_o, bwd_t = res.med(OURS) - res.med(OURS, "fwd"), res.med(best) - res.med(best, "fwd")
    bwd_r = bwd_t / bwd_o if bwd_o > 0 else float("nan")
    eq = res.ratio(res.sides[1])
    parts = [f"{'meets' if r >= 1 else 'misses'} the 1.0x target against the faster PyTorch setting ({r:.2f}x; "
             f"{eq:.2f}x at equal threads)."]
    if len(res.sides) > 2 and best != res.sides[1]:
        parts.append(f"PyTorch ran faster on 1 thread than on {res.threads}, most likely because with other "
                     "processes on these cores its OpenMP threads wait at each op's barrier for a thread that "
                     "is not scheduled.")
    parts.append(f"By phase, ours vs {side_label(res, best)}: forward {fwd_r:.2f}x, backward + update "
                 f"{bwd_r:.2f}x (above 1 = ours faster).")
    if r < 1 and res.op_kinds:
        share = lambda k: f"{100 * res.op_kinds.get(k, 0.0) / sum(res.op_kinds.values()):.0f}%"
        reach = res.step_flops / res.med(OURS) / 1e9 / res.matmul["xla"]
        reach_t = res.step_flops / res.med(best) / 1e9 / res.matmul[best]
        where = "the backward pass" if bwd_r < fwd_r else "the forward pass"
        backward = [op for op in res.top_ops if "transpose(jvp" in op[3]]
        text = (f"What limits ours: mostly {where}. Our XLA op time is {share('matmuls')} matmuls, "
                f"{share('layout copies / transposes')} transposing copies, {share('broadcasts')} broadcasts "
                f"and {share('elementwise / reductions / other')} other elementwise work")
        if backward:
            text += (f"; {len(backward)} of the {len(res.top_ops)} costliest ops are backward ops: "
                     + "; ".join(describe_op(*op) for op in backward))
        parts.append(text + f". Our step reaches {100 * reach:.0f}% of XLA's own fp32 matmul rate on this "
                     f"machine, {side_label(res, best)} {100 * reach_t:.0f}% of its own.")
    return " ".join(parts)


def render_train(results: Sequence[TrainStepResult], command: str, info: dict[str, str],
                 allow_load: bool = False) -> str:
    first = results[0]
    lines = common.header("SFT train step: dlr_jax Trainer vs PyTorch (transformers + AdamW)", command, info) + [
        "Both sides train the same random Llama (a `transformers` `LlamaForCausalLM` saved, then imported "
        "with `dlr_jax.convert.load_hf`), fp32, on the same SFT-shaped batch (right-padded rows; prompt "
        "tokens are not targets; segment ids 1 / 0 on padding, no packing, as `transformers` needs). Loss: "
        "next-token cross-entropy averaged over the target tokens (`dlr_jax.stages.common.lm_loss`; "
        "`labels=-100` off-target in `transformers`). Update: global-norm clip 1.0, then AdamW (lr "
        f"{LEARNING_RATE:g} constant, betas 0.9/0.999, eps 1e-8, weight decay {WEIGHT_DECAY:g} on matrices "
        f"only); PyTorch uses `torch.optim.AdamW({first.opt_kind})`. Ours is `Trainer.train_step` (host "
        "batch in, metrics back as floats); theirs is zero_grad + forward + backward + clip + step + "
        "`float(loss)`. Every side runs in its own process (in one process the two frameworks slow each "
        "other down: `dlr_jax/bench/workers.py`), one step at a time, interleaved (order reversed every other "
        "round); PyTorch runs twice from the same saved weights, with as many threads as XLA uses "
        "(`torch.set_num_threads`) and with one. Tokens/s counts all batch tokens (padding included); "
        "target tokens/s only the supervised ones.",
        "",
    ]
    for res in results:
        lines += render_case(res, allow_load)
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------------
# CLI hooks (`python -m dlr_jax.bench --only train`).


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--train-cases", default="demo,medium",
                    help="train benchmark: comma-separated cases of " + ", ".join(CASES)
                    + " (demo: configs/tiny.yaml's model, batch 32 x 112; medium: the sampling benchmark's medium "
                    "size, 8 x 256)")
    ap.add_argument("--train-repeats", type=int, default=5, help="train benchmark: timed steps per side (>= 1)")


def check_arguments(args: argparse.Namespace) -> str | None:
    """The problem with the train flags, or None."""
    names = [n.strip() for n in args.train_cases.split(",") if n.strip()]
    bad = [n for n in names if n not in CASES]
    if bad or not names:
        return f"--train-cases: unknown case(s) {bad or args.train_cases!r}; choose from {','.join(CASES)}"
    if args.train_repeats < 1:
        return f"--train-repeats must be >= 1, got {args.train_repeats}"
    return None


def run_section(args: argparse.Namespace, command: str, info: dict[str, str],
                log: Callable[[str], None] = print) -> str:
    """Runs the `train` benchmark for `args.train_cases` and returns its BENCHMARKS.md section."""
    err = check_arguments(args)
    if err:
        raise ValueError(err)
    cases = train_cases()
    names = [n.strip() for n in args.train_cases.split(",") if n.strip()]
    load = common.start_load(args)  # before any case ran: the cases run back to back
    results = [dataclasses.replace(bench_train(cases[n], repeats=args.train_repeats, log=log), loads=(load,))
               for n in names]
    return render_train(results, command, info, allow_load=getattr(args, "allow_load", False))
