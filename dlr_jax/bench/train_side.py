"""One side of the `train` benchmark in its own process (see `workers.py` for why).

    python -m dlr_jax.bench.train_side SIDE DIR   (started by `train.bench_train`)

SIDE is `ours` (the `Trainer` on the imported HF model) or `torch<threads>` (the PyTorch reference
at that thread count). DIR holds the saved HF model (`hf/`), the batch (`batch.npz`) and the run's
settings (`spec.json`). The worker builds its side, prints `READY` (the forward-only loss on the
initial weights, the parameter count, the optimizer), then answers commands on stdin: `step` (one
optimizer step: seconds and loss), `fwd` (a forward-only loss: seconds), `profile` or `flops` (ours
only: the step's XLA-counted FLOPs, with `profile` also one more compile and the op-time
breakdown of a traced step), `quit`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.bench import common, op_profile, train
from dlr_jax.bench import peer_protocol as protocol
from dlr_jax.bench.train import FWD, PROFILE, TRAIN


def build_ours(root: Path, spec: dict[str, Any], batch: dict[str, np.ndarray]) -> dict[str, Any]:
    import jax
    from flax import nnx

    from dlr_jax.convert import load_hf

    _, model = load_hf(root / "hf")
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    trainer = train.our_trainer(model, Path(tempfile.mkdtemp(dir=root)), spec["batch_size"], spec["lr"],
                                spec["weight_decay"])
    fwd = train.our_forward(trainer)

    def profile(full: bool) -> dict[str, Any]:
        flops, compile_s, hlo = train.step_flops(trainer, batch, compile=full)
        kinds, top = op_profile.op_breakdown(lambda: trainer.train_step(batch)) if full else ({}, [])
        names = op_profile.hlo_op_names(hlo)
        return {"flops": flops, "compile_s": compile_s, "kinds": kinds,
                "top": [(n, sec, *names.get(n, ("?", "?"))) for n, sec in top]}

    return {"step": lambda: trainer.train_step(batch)["loss"], "fwd": lambda: fwd(batch), "profile": profile,
            "params": n_params, "opt": "optax adamw", "close": trainer.ckpt.close}


def build_torch(root: Path, spec: dict[str, Any], batch: dict[str, np.ndarray], threads: int) -> dict[str, Any]:
    import torch
    import transformers as tf


    torch.set_num_threads(threads)
    hf = tf.LlamaForCausalLM.from_pretrained(root / "hf", dtype=torch.float32)
    ref = train.TorchSFT(hf, spec["lr"], spec["weight_decay"], 1.0, threads)
    n_params = sum(p.numel() for p in ref.params)
    return {"step": lambda: ref.step(batch), "fwd": lambda: ref.forward_loss(batch), "profile": None,
            "params": n_params, "opt": ref.opt_kind, "close": lambda: None}


def main(argv: list[str]) -> int:
    side, root = argv[1], Path(argv[2])
    spec = json.loads((root / "spec.json").read_text())
    with np.load(root / "batch.npz") as z:
        batch = {k: z[k] for k in z.files}
    try:
        if side == "ours":
            s = build_ours(root, spec, batch)
        elif side.startswith("torch") and side[5:].isdigit():
            s = build_torch(root, spec, batch, int(side[5:]))
        else:
            raise ValueError(f"unknown side {side!r}: ours or torch<threads>")
        protocol.send(protocol.READY, {"forward_loss": float(s["fwd"]()), "params": s["params"], "opt": s["opt"]})
        while (cmd := protocol.wait_command()) != "quit":
            if cmd == "step":
                seconds, loss = common.timed(s["step"])
                protocol.send(TRAIN, {"seconds": seconds, "loss": float(loss)})
            elif cmd == "fwd":
                protocol.send(FWD, {"seconds": common.timed(s["fwd"])[0]})
            elif cmd in ("profile", "flops") and s["profile"] is not None:
                protocol.send(PROFILE, s["profile"](cmd == "profile"))
            else:
                raise ValueError(f"{side}: unknown command {cmd!r}")
        s["close"]()
    except Exception as e:  # the orchestrator reports it with this worker's log
        protocol.send(protocol.ERROR, {"error": f"{type(e).__name__}: {e}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
