"""chex trace guards: every jitted step of the pipeline is traced once across >= 3 steps whose batches
differ in content (not in shape). A retrace per step (a Python scalar argument, a changing shape, a new
closure) silently turns a 1-second step into a 30-second one; `chex.assert_max_traces` turns it into a
failure. Each guard is also shown to fire on a real retrace (a new shape), so none of them is vacuous."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.generate import sampler as sampling
from dlr_jax.models.transformer import Transformer
from dlr_jax.training.trainer import TrainConfig, Trainer

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8)
TCFG = TrainConfig(learning_rate=1e-2, batch_size=4, num_steps=10, log_every=1, checkpoint_every=100,
                   progress=False, async_checkpointing=False)


@pytest.fixture(autouse=True)
def _fresh_counters():
    chex.clear_trace_counter()
    yield
    chex.clear_trace_counter()


def lm_loss(model, batch, rng):
    logits = model(batch["tokens"][:, :-1])
    targets, mask = batch["tokens"][:, 1:], batch["mask"][:, 1:].astype(jnp.float32)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    return jnp.sum(nll * mask), jnp.sum(mask), {"nll": jnp.sum(nll * mask)}


def _lm_batch(seed: int, b: int = 4, t: int = 12) -> dict[str, np.ndarray]:
    rs = np.random.RandomState(seed)
    lens = rs.randint(4, t + 1, b)
    return {"tokens": rs.randint(0, CFG.vocab_size, (b, t)).astype(np.int32),
            "mask": (np.arange(t)[None] < lens[:, None]).astype(np.int32)}


def test_trainer_step_traces_once(tmp_path):
    loss = chex.assert_max_traces(lm_loss, n=1)  # the step traces its loss once per compilation
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), loss, TCFG, tmp_path, mesh=None)
    losses = [trainer.train_step(_lm_batch(seed))["loss"] for seed in range(3)]
    assert len(set(losses)) == 3 and trainer.step == 3  # three different batches, all run
    with pytest.raises(AssertionError, match="assert_max_traces"):  # a new shape retraces: caught
        trainer.train_step(_lm_batch(9, t=10))


def test_grpo_update_traces_once(tmp_path):
    from dlr_jax.stages.rl.loss import make_grpo_loss
    from dlr_jax.stages.rl.step import grpo_update

    loss = chex.assert_max_traces(make_grpo_loss(temperature=1.0, beta=1e-3), n=1)
    trainer = Trainer(Transformer(CFG, rngs=nnx.Rngs(0)), loss, TCFG, tmp_path, mesh=None)

    def rollouts(seed: int, n: int = 8, p: int = 6, c: int = 6) -> dict[str, np.ndarray]:
        rs = np.random.RandomState(seed)
        gen = np.arange(c)[None] < rs.randint(1, c + 1, n)[:, None]
        return {"tokens": rs.randint(0, CFG.vocab_size, (n, p + c)).astype(np.int32),
                "attention_mask": np.concatenate([np.ones((n, p)), gen], 1).astype(np.int32),
                "completion_mask": np.concatenate([np.zeros((n, p)), gen], 1).astype(np.float32),
                "old_logps": -rs.rand(n, p + c).astype(np.float32), "ref_logps": -rs.rand(n, p + c).astype(np.float32),
                "advantages": rs.randn(n).astype(np.float32)}

    for step in range(2):  # 2 RL steps x 2 epochs x 2 minibatches = 8 updates on different rollouts
        out = grpo_update(trainer, rollouts(step), epochs=2, seed=0, step=step)
        assert np.isfinite(out["loss"])
    assert trainer.step == 8
    with pytest.raises(AssertionError, match="assert_max_traces"):
        grpo_update(trainer, rollouts(5, c=7), epochs=1, seed=0, step=2)


@pytest.fixture
def traced_sampler(monkeypatch):
    """A Sampler whose jitted prefill and decode bodies are trace-counted: decode once; prefill twice, as
    the sampler also evaluates it abstractly once (`jax.eval_shape`, no compile) to learn the vocab size."""
    monkeypatch.setattr(sampling, "_prefill", chex.assert_max_traces(sampling._prefill, n=2))
    monkeypatch.setattr(sampling, "decode_loop", chex.assert_max_traces(sampling.decode_loop, n=1))
    return sampling.Sampler(Transformer(CFG, rngs=nnx.Rngs(0)), prompt_bucket=16, max_total_len=32)


def test_sampler_prefill_and_decode_trace_once(traced_sampler):
    rs = np.random.RandomState(0)
    outs = []
    for i, temp in enumerate((0.7, 1.0, 1.3)):  # other prompts (lengths within one bucket), temperature, seed
        prompts = [rs.randint(1, CFG.vocab_size, n).tolist() for n in rs.randint(2, 17, 4)]
        outs.append(traced_sampler.generate(prompts, max_new_tokens=8, temperature=temp, rng=i).tokens)
    assert not np.array_equal(outs[0], outs[1])
    with pytest.raises(AssertionError, match="assert_max_traces"):  # a longer prompt bucket: a new prefill
        traced_sampler.generate([rs.randint(1, CFG.vocab_size, 20).tolist()] * 4, max_new_tokens=8,
                                temperature=1.0, rng=3)


@pytest.mark.slow  # one compile of the micro encoder + VQ + decoder step at 64 px
def test_codebook_step_traces_once(tmp_path):
    from pathlib import Path

    from dlr_jax.config import load_config
    from dlr_jax.data import render_pipeline as rp
    from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model
    from dlr_jax.stages.codebook.stage import codebook_loss
    from tests.micro import codebook_nets

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", [
        "codebook.min_side=64", "codebook.max_side=64", "codebook.image_size=64", "codebook.max_text_len=32",
        *codebook_nets(num_queries=1), "latent.num_latents=16", "latent.latent_dim=16"])
    model = build_codebook_model(CodebookModelConfig.from_config(cfg), seed=0)
    @chex.assert_max_traces(n=1)
    def loss(model, batch, rng):  # the stage's loss as `codebook.run` binds it
        return codebook_loss(model, batch, rng, lambda_vq=0.25, beta=0.1, dropout=0.5)

    trainer = Trainer(model, loss, dataclasses.replace(TCFG, batch_size=4), tmp_path, mesh=None)
    texts = [f"{i} + {i + 4} = {2 * i + 4}" for i in range(12)]
    plan = rp.BatchPlan(texts, batch_size=4, seed=0, config=rp.render_config(cfg.codebook), max_text_len=32)
    assert len(plan) == 3 and set(plan.sides.tolist()) == {64}
    batches = [rp.render_train_batch(i, None, plan=plan, rows=slice(None)) for i in range(3)]
    assert not np.array_equal(batches[0]["images"], batches[1]["images"])
    for b in batches:  # the main phase (alpha = 0: no `alpha` field), three different batches
        assert np.isfinite(trainer.train_step(b)["loss"])
