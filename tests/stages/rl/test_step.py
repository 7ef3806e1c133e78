"""The GRPO step's pieces on a plain tiny Transformer: rollouts laid out as the trainer's batch, and a
toy task on which GRPO updates raise the reward. (The stage end to end, resume included, is in
test_rl.py; the mu = 1 and one-pass scoring shortcuts in test_rl_fast_paths.py.)"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig, TrainConfig
from dlr_jax.core.sharding import create_sharded, make_mesh
from dlr_jax.generate.sampler import Sampler
from dlr_jax.models.transformer import Transformer
from dlr_jax.stages.rl.grpo import group_advantages
from dlr_jax.stages.rl.loss import make_grpo_loss
from dlr_jax.stages.rl.step import assemble_rollouts, grpo_update
from dlr_jax.training.trainer import Trainer

TOY = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16)


@pytest.fixture(scope="module")
def toy_model():
    return create_sharded(lambda: Transformer(TOY, rngs=nnx.Rngs(0)), make_mesh(1, 1, 1, devices=jax.devices()[:1]))


def toy_rollouts(model, n_prompts=4, group=8, new=6, temperature=1.0, seed=0):
    """n_prompts x group sampled rollouts laid out as the trainer's batch, old log-probs scored."""
    prompts = [[1 + (i % 5), 2 + i] for i in range(n_prompts) for _ in range(group)]
    s = Sampler(model, prompt_bucket=4)
    out = s.generate(prompts, max_new_tokens=new, temperature=temperature, rng=seed)
    batch = assemble_rollouts(prompts, out.tokens, out.lengths, 4, 0)
    lp = s.score(batch["tokens"], batch["attention_mask"], temperature=temperature)
    batch["old_logps"] = lp * batch["completion_mask"]
    return batch, out


def test_grpo_updates_raise_a_toy_reward(toy_model, tmp_path):
    """Reward = share of completion tokens equal to 3: a few GRPO steps must make 3 more likely."""
    model = nnx.clone(toy_model)  # the trainer donates its parameters
    tcfg = TrainConfig(learning_rate=2e-2, warmup_ratio=0.0, batch_size=16, num_steps=40, progress=False,
                       async_checkpointing=False)
    loss_fn = make_grpo_loss(temperature=1.0, beta=0.0)
    trainer = Trainer(model, loss_fn, tcfg, tmp_path, name="toy")
    rewards = []
    for step in range(10):
        policy = nnx.merge(trainer.graphdef, trainer.params, trainer.rest)
        batch, out = toy_rollouts(policy, seed=step)
        gen = batch["completion_mask"][:, 4:]
        r = ((out.tokens == 3) * gen).sum(1) / np.maximum(gen.sum(1), 1)
        rewards.append(float(r.mean()))
        batch["advantages"] = np.asarray(group_advantages(r, 8))
        m = grpo_update(trainer, batch, epochs=2, seed=0, step=step)
        assert m["clip_ratio/region_mean"] < 0.5
    print("toy rewards", np.round(rewards, 3))
    assert np.mean(rewards[-3:]) > np.mean(rewards[:2]) + 0.2, rewards


def test_assemble_rollouts_left_pads_prompts_and_masks_the_completions():
    tokens = np.array([[5, 6, 7], [8, 9, 9]])  # row 1 stopped after one token: the rest is not its own
    batch = assemble_rollouts([[1, 2], [3]], tokens, np.array([3, 1]), 3, 0)
    np.testing.assert_array_equal(batch["tokens"], [[0, 1, 2, 5, 6, 7], [0, 0, 3, 8, 0, 0]])
    np.testing.assert_array_equal(batch["attention_mask"], [[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]])
    np.testing.assert_array_equal(batch["completion_mask"], [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0]])
    assert [batch[k].dtype for k in ("tokens", "attention_mask", "completion_mask")] == [np.int32, np.int32,
                                                                                          np.float32]
