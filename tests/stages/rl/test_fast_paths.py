"""The GRPO step's shortcuts give the numbers of the long way: mu = 1 without an old-policy pass (the
loss takes its own stop-gradient log-probs: same loss and gradient as two passes), and the old and
reference log-probs scored in one jitted pass (`Sampler.score_states`: same as one pass each)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from dlr_jax.generate.sampler import Sampler
from dlr_jax.stages.rl import stage as rl
from tests.stages.rl.test_step import toy_model, toy_rollouts  # noqa: F401 - the fixture is used by name


def loss_and_grad(loss_fn, model, batch):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    dev = {k: jax.numpy.asarray(v) for k, v in batch.items()}

    def f(p):
        ls, w, met = loss_fn(nnx.merge(graphdef, p, rest), dev, jax.random.key(0))
        return ls / w, met

    (loss, met), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return float(loss), grads, {k: float(v) for k, v in met.items()}


def test_skipping_the_old_policy_pass_keeps_loss_and_gradient(toy_model):  # noqa: F811
    batch, out = toy_rollouts(toy_model, temperature=0.7)
    batch["advantages"] = np.random.RandomState(1).normal(size=len(out.tokens)).astype(np.float32)
    batch["ref_logps"] = batch["old_logps"] - 0.05 * batch["completion_mask"]  # a KL term that matters
    loss_fn = rl.make_grpo_loss(temperature=0.7, beta=0.04)
    two_pass = loss_and_grad(loss_fn, toy_model, batch)
    skipped = {k: v for k, v in batch.items() if k != "old_logps"}
    prompt = batch["tokens"].shape[1] - out.logprobs.shape[1]
    skipped["sampler_logps"] = np.concatenate([np.zeros((len(out.tokens), prompt), np.float32), out.logprobs],
                                              axis=1) * batch["completion_mask"]
    one_pass = loss_and_grad(loss_fn, toy_model, skipped)
    np.testing.assert_allclose(one_pass[0], two_pass[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(one_pass[1]), jax.tree.leaves(two_pass[1]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    w = float(batch["completion_mask"].sum())
    assert abs(one_pass[2]["ratio_mean"] / w - 1.0) < 1e-6 and one_pass[2]["clip_ratio/region_mean"] == 0.0
    # the sampler's own log-probs agree with the policy's: the check the skipped pass used to make
    assert one_pass[2]["logprob_gap/max"] / w < 1e-4 and "logprob_gap/max" not in two_pass[2]


def test_scoring_several_states_in_one_pass_matches_one_pass_each(toy_model):  # noqa: F811
    batch, _ = toy_rollouts(toy_model, temperature=0.7)
    sampler = Sampler(toy_model, prompt_bucket=4)
    other = jax.tree.map(lambda x: x * 1.5 if x.ndim == 2 else x, sampler.state)  # a different "reference"
    kw = dict(temperature=0.7, vocab_mask=np.arange(16) != 5)
    both = sampler.score_states([sampler.state, other], batch["tokens"], batch["attention_mask"], **kw)
    alone = [sampler.score(batch["tokens"], batch["attention_mask"], **kw)]
    sampler.set_state(other)
    alone.append(sampler.score(batch["tokens"], batch["attention_mask"], **kw))
    assert not np.allclose(alone[0], alone[1])
    for a, b in zip(both, alone, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
