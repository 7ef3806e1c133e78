"""A reward for the multi-process tests (imported by `rl.reward_modules=[tests.mp_rewards]` in the
spawned processes): it varies between the rollouts of a group even for an untrained model, so GRPO's
advantages, and so its gradients, are not zero (an all-zero-reward update is rounding noise, which
Adam blows up to full-size steps and no two topologies would agree on)."""

import numpy as np

from dlr_jax.rewards.answer_format import RewardInputs, register_reward


@register_reward("distinct_share")
def distinct_share(inputs: RewardInputs) -> np.ndarray:
    """Distinct generated token ids / generated tokens, per rollout."""
    ids, mask = np.asarray(inputs.completion_ids), np.asarray(inputs.completion_mask) > 0
    return np.asarray([len(set(r[m].tolist())) / max(int(m.sum()), 1) for r, m in zip(ids, mask, strict=True)],
                      np.float32)


@register_reward("distinct_share_even_golds")
def distinct_share_even_golds(inputs: RewardInputs) -> np.ndarray:
    """`distinct_share` for problems with an even gold answer, 0 for the others: groups with and without a
    spread in one batch, so that dynamic sampling (rl.dynamic_sampling) drops some and refills."""
    even = np.asarray([int(g) % 2 == 0 for g in inputs.golds])
    return np.where(even, distinct_share(inputs), 0.0).astype(np.float32)
