"""One side of the `gpu` benchmark in its own process (`workers.py` says why; on a GPU also because JAX and
PyTorch would each claim the device's memory).

    python -m dlr_jax.bench.gpu_side SIDE DIR   (started by `gpu.run_benchmark`)

SIDE is `ours` (the `Trainer` SFT step and the rl stage's `GRPOStep`, on a random model of the case's shape)
or `torch` (`transformers`' LlamaForCausalLM with SDPA attention, fused AdamW, bf16 autocast over fp32 master
weights). DIR holds the case (`spec.json`) and the packed batch (`batch.npz`). The worker runs its whole side
and prints one `RESULT` line (`peer_protocol`); a side that fails prints `ERROR` with the reason.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.bench import peer_protocol as protocol

RESULT = "RESULT"


def _timed_steps(step, repeats: int) -> tuple[float, list[float], list[float]]:
    """(seconds of the first call, seconds of each of `repeats` more, every call's loss)."""
    t0 = time.perf_counter()
    losses = [float(step())]
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        losses.append(float(step()))
        times.append(time.perf_counter() - t0)
    return first, times, losses


# ---------------------------------------------------------------------------------------------------------------
# Ours.


def model_config(spec: dict[str, Any]) -> Any:
    from dlr_jax.config import ModelConfig

    return ModelConfig(**spec["model"])


def target_for(device_kind: str) -> Any:
    """The planner's target (`plan.targets`) for this GPU, or None where it has none."""
    from dlr_jax.plan.targets import TARGETS

    kind = device_kind.upper()
    for name in ("h200", "h100"):
        if name.upper() in kind:
            return TARGETS[name]
    return None


def run_ours(spec: dict[str, Any], batch: dict[str, np.ndarray], root: Path) -> dict[str, Any]:
    import jax

    from dlr_jax.core import compile_cache

    cache = compile_cache.enable(log=False)  # on a GPU: a rerun reads the compiled programs back
    device = jax.devices()[0]
    mcfg = model_config(spec)
    out: dict[str, Any] = {"device": device.device_kind, "backend": jax.default_backend(), "compile_cache": cache,
                           "jax": jax.__version__}
    out |= run_ours_sft(spec, mcfg, batch, root, device)  # returns with its trainer and model freed
    out["grpo"] = run_ours_grpo(spec, mcfg, root)
    return out


def run_ours_sft(spec: dict[str, Any], mcfg: Any, batch: dict[str, np.ndarray], root: Path,
                 device: Any) -> dict[str, Any]:
    """The SFT step: timed steps (the first compiles it), then its FLOPs counted on the program and what the
    planner says of it compiled (`plan.cli.device_estimate`; read back from the compilation cache on a GPU)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dlr_jax.config import TrainConfig
    from dlr_jax.core.sharding import create_sharded, make_mesh
    from dlr_jax.models.transformer import Transformer
    from dlr_jax.plan.cli import device_estimate
    from dlr_jax.plan.flops import count_jaxpr
    from dlr_jax.plan.targets import Target
    from dlr_jax.stages.common import count_params, lm_loss
    from dlr_jax.training.trainer import Trainer, build_step_fn

    mesh = make_mesh(1, 1, 1, devices=[device])
    t0 = time.perf_counter()
    model = create_sharded(lambda: Transformer(mcfg, rngs=nnx.Rngs(params=0)), mesh, "fsdp")
    out: dict[str, Any] = {"params": count_params(model)}
    # Constant learning rate, as on the PyTorch side
    tcfg = TrainConfig(learning_rate=1e-4, warmup_ratio=0.0, min_lr_ratio=1.0, weight_decay=0.01, grad_clip=1.0,
                       batch_size=spec["batch"], num_steps=1, progress=False, async_checkpointing=False)
    trainer = Trainer(model, lm_loss, tcfg, Path(tempfile.mkdtemp(dir=root)), mesh=mesh, name="gpu")
    out["init_s"] = time.perf_counter() - t0
    step = jnp.asarray(0, jnp.int32)
    pure = build_step_fn(trainer.graphdef, trainer.loss_fn, trainer.tx, trainer.schedule)
    jaxpr = jax.make_jaxpr(pure)(trainer.params, trainer.rest, trainer.opt_state, trainer.device_batch(batch),
                                 trainer.rng, step)
    count = count_jaxpr(jaxpr)  # every op of the step: forward, backward, loss, optimizer
    out |= {"flops": count.total, "matmul_flops": count.matmul, "loops_counted_once": count.unknown_loops}
    first, times, losses = _timed_steps(lambda: trainer.train_step(batch)["loss"], spec["repeats"])
    out["sft"] = {"first_s": first, "step_s": times, "losses": losses}
    stats = device.memory_stats() or {}
    out |= {"peak_bytes_measured": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit")}
    t0 = time.perf_counter()
    compiled = trainer.lower_step(batch).compile()
    out["estimate_compile_s"] = time.perf_counter() - t0
    target = target_for(device.device_kind)
    if target is not None:
        out |= {"target": target.name, "peak_flops": target.peak_flops}
    else:  # no peak numbers for this device: the buffer assignment alone
        target = Target(device.device_kind, device.platform, float("inf"), float("nan"), float("nan"))
    est = device_estimate(compiled, count.total, target)
    out["plan"] = {k: v for k, v in est.items() if isinstance(v, (int, float, str, bool)) or v is None}
    trainer.ckpt.close()
    return out


def run_ours_grpo(spec: dict[str, Any], mcfg: Any, root: Path) -> dict[str, Any]:
    """The rl stage's GRPO step (`bench.grpo_ours`: rollout, score, advantages, mu updates) at the case's shape."""
    from flax import nnx

    from dlr_jax.bench import grpo_ours
    from dlr_jax.core.sharding import create_sharded
    from dlr_jax.models.transformer import Transformer

    g = spec["grpo"]
    rng = np.random.default_rng(1)
    eos, pad = 1, 0
    prompts = [rng.integers(2, mcfg.vocab_size, g["prompt_len"]).tolist() for _ in range(g["prompts"])]
    work = {"prompts": prompts, "group": g["group"], "new_tokens": g["new_tokens"], "temperature": 1.0,
            "mu": g["mu"], "beta": 1e-3, "epsilon": 0.2, "lr": 1e-6, "seed": 0, "eos_id": eos, "pad_id": pad,
            "steps": g["steps"] + 1}

    def make_model(mesh, rules):
        return create_sharded(lambda: Transformer(mcfg, rngs=nnx.Rngs(params=0)), mesh, rules)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        step = grpo_ours.build_step(work, tmp, make_model)
        build_s = time.perf_counter() - t0
        records = [step(i + 1) for i in range(g["steps"] + 1)]
    rows = g["prompts"] * g["group"]
    return {"build_s": build_s, "first": records[0], "steps": records[1:], "rows": rows,
            "seq": g["prompt_len"] + g["new_tokens"]}


# ---------------------------------------------------------------------------------------------------------------
# PyTorch.


def torch_inputs(torch: Any, batch: dict[str, np.ndarray], device: str) -> dict[str, Any]:
    """Packed rows for `transformers`: no attention mask, position ids restarting at every segment, from which
    its mask code builds the block-diagonal causal mask (padding: one-token segments, never a target)."""
    from dlr_jax.bench.train import target_mask

    tokens = torch.from_numpy(np.asarray(batch["tokens"], np.int64)).to(device)
    labels = torch.where(torch.from_numpy(target_mask(batch)).to(device), tokens, torch.full_like(tokens, -100))
    return {"input_ids": tokens, "labels": labels, "use_cache": False,
            "position_ids": torch.from_numpy(np.asarray(batch["positions"], np.int64)).to(device)}


def segments_as_rows(batch: dict[str, np.ndarray], row: int) -> dict[str, np.ndarray]:
    """The segments of one packed row, one a row, right-padded (segment ids 1 / 0): the packing check's batch."""
    seg = batch["segment_ids"][row]
    ids = [s for s in np.unique(seg) if s > 0]
    t = max(int((seg == s).sum()) for s in ids)
    out = {k: np.zeros((len(ids), t), np.int32) for k in ("tokens", "loss_mask", "segment_ids", "positions")}
    for i, s in enumerate(ids):
        m = seg == s
        n = int(m.sum())
        out["tokens"][i, :n] = batch["tokens"][row][m]
        out["loss_mask"][i, :n] = batch["loss_mask"][row][m]
        out["segment_ids"][i, :n] = 1
        out["positions"][i, :n] = np.arange(n)
    return out


def run_torch(spec: dict[str, Any], batch: dict[str, np.ndarray]) -> dict[str, Any]:
    import torch
    import transformers as tf

    from dlr_jax.convert import hf_config_dict

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if spec["device"] == "gpu" and device != "cuda":
        raise RuntimeError(f"torch {torch.__version__} sees no CUDA device: install a CUDA build of torch")
    tf.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf = tf.LlamaConfig(**hf_config_dict(model_config(spec), "float32"), attn_implementation="sdpa")
    with torch.device(device):  # initialised where it trains
        model = tf.LlamaForCausalLM(hf).train()  # fp32 master weights
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.01},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, fused=True)
        opt_kind = "fused=True"
    except (RuntimeError, ValueError):
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, foreach=True)
        opt_kind = "foreach=True (fused is unsupported here)"
    inputs = torch_inputs(torch, batch, device)
    init_s = time.perf_counter() - t0

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return float(loss.detach())  # waits for the device

    def forward_loss(b: dict[str, np.ndarray], packed: bool) -> float:
        x = torch_inputs(torch, b, device)
        if not packed:
            x["attention_mask"] = torch.from_numpy(np.asarray(b["segment_ids"] > 0, np.int64)).to(device)
        with torch.no_grad(), torch.autocast(device_type=device, dtype=torch.bfloat16):
            return float(model(**x).loss)

    # the reference attends within segments: row 0 packed gives the loss of its segments one a row
    row0 = {k: v[:1] for k, v in batch.items()}
    check = (forward_loss(row0, True), forward_loss(segments_as_rows(batch, 0), False))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first, times, losses = _timed_steps(step, spec["repeats"])
    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "transformers": tf.__version__, "opt": opt_kind, "init_s": init_s, "params": sum(p.numel() for p in params),
            "sft": {"first_s": first, "step_s": times, "losses": losses}, "packing_check": check,
            "peak_bytes_measured": torch.cuda.max_memory_allocated() if device == "cuda" else None}


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str]) -> int:
    side, root = argv[1], Path(argv[2])
    spec = json.loads((root / "spec.json").read_text())
    with np.load(root / "batch.npz") as z:
        batch = {k: z[k] for k in z.files}
    try:
        if side == "ours":
            result = run_ours(spec, batch, root)
        elif side == "torch":
            result = run_torch(spec, batch)
        else:
            raise ValueError(f"unknown side {side!r}: ours or torch")
    except Exception as e:  # the orchestrator reports it with this worker's log
        protocol.send(protocol.ERROR, {"error": f"{type(e).__name__}: {e}"[:2000]})
        raise
    protocol.send(RESULT, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
