"""The codebook training step of configs/tiny.yaml (latent.source=codebook), jitted forward + backward at batch 32,
timed by parts: the probe behind BENCHMARKS "make demo"'s note on this host's speed drifting. Run from the repo root:
`.venv/bin/python results/bench/host_drift_2026-11-27/codebook_step.py` (its two runs are in output.txt)."""

import time

import jax
import jax.numpy as jnp
from flax import nnx

from dlr_jax.config import load_config
from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.sources import corpus_texts
from dlr_jax.models.codebook_model import build_codebook_model, teacher_inputs
from dlr_jax.stages import codebook as cbs


def ms_per_call(f, *args, n: int = 10) -> float:
    jax.block_until_ready(f(*args))  # compile
    t = time.perf_counter()
    for _ in range(n):
        r = f(*args)
    jax.block_until_ready(r)
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    cfg = load_config("configs/tiny.yaml", ["latent.source=codebook"])
    graphdef, state = nnx.split(build_codebook_model(cbs.model_config(cfg), 0))
    plan = rp.BatchPlan(corpus_texts(cfg)[:64], batch_size=32, seed=0, config=rp.render_config(cfg.codebook),
                        max_text_len=64)
    b = rp.render_train_batch(0, None, plan=plan, rows=slice(None))
    images, targets = jnp.asarray(b["images"]), jnp.asarray(b["targets"])

    def enc(st, images):
        return jnp.sum(nnx.merge(graphdef, st).encode(images) ** 2)

    def dec(st, h, targets):
        inputs, mask = teacher_inputs(targets)
        return jnp.sum(cbs._nll(nnx.merge(graphdef, st).decoder_logits(h, inputs, mask), targets))

    def full(st, images, targets):
        batch = {"images": images, "targets": targets}
        return cbs.warmup_loss(nnx.merge(graphdef, st), batch, jax.random.key(0), dropout=1.0)[0]

    h = nnx.merge(graphdef, state).encode(images)
    print("enc fwd ms", ms_per_call(jax.jit(enc), state, images))
    print("enc fwd+bwd ms", ms_per_call(jax.jit(jax.grad(enc)), state, images))
    print("dec fwd ms", ms_per_call(jax.jit(dec), state, h, targets))
    print("dec fwd+bwd ms", ms_per_call(jax.jit(jax.grad(dec)), state, h, targets))
    print("full fwd+bwd ms", ms_per_call(jax.jit(jax.grad(full)), state, images, targets))


if __name__ == "__main__":
    main()
