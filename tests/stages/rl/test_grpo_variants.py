"""What the field added to GRPO, checked against NumPy (float64) transcriptions of the published formulas on fixed
inputs: GSPO's sequence-level ratio (and its loss, TRL's `importance_sampling_level="sequence"`), the truncated
importance weights of the sampler/trainer mismatch correction, DAPO's soft overlong penalty and its zero-variance
group filter, and the mismatch statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.stages.rl.grpo import (
    grpo_loss,
    mismatch_stats,
    soft_overlong_penalty,
    truncated_is_weights,
    zero_std_fraction,
    zero_variance_groups,
)
from tests.stages.rl.test_grpo import MODE_FOR, ref_weights

# ----------------------------------------------------------------------------------------------------
# GSPO (Zheng et al., 2025, Eq. 5-7; TRL's importance_sampling_level="sequence"):
#   s_i = exp( sum_t m_it (logp_it - old_it) / max(sum_t m_it, 1) )
#   per-token loss of rollout i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i) + beta k3_it
# aggregated as TRL's loss_type.
# ----------------------------------------------------------------------------------------------------


def gspo_reference(logp, old, ref, adv, mask, loss_type, eps_low, eps_high, beta, max_len=None):
    s = np.exp((mask * (logp - old)).sum(-1) / np.maximum(mask.sum(-1), 1))[:, None]
    a = adv[:, None]
    per_token = -np.minimum(s * a, np.clip(s, 1 - eps_low, 1 + eps_high) * a) * np.ones_like(logp)
    if beta:
        d = ref - logp
        per_token = per_token + beta * (np.exp(d) - d - 1)
    return float((per_token * ref_weights(mask, loss_type, max_len)).sum())


def _gspo_inputs():
    """Sequence log-ratios around GSPO's clip range (3e-4 / 4e-4), on both sides, with token noise that
    averages out per sequence: both clip regions and unclipped rollouts occur."""
    rng = np.random.default_rng(7)
    b, t = 6, 7
    logp = -rng.uniform(0.05, 3.0, size=(b, t))
    lengths = np.array([7, 1, 5, 6, 3, 4])
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    shift = np.array([-1e-3, -1e-4, 2e-4, 1e-3, -6e-4, 6e-4])  # mean log-ratio of each rollout
    noise = rng.normal(0, 0.05, size=(b, t)) * mask
    noise -= (noise.sum(1, keepdims=True) / lengths[:, None]) * mask  # zero mean over each rollout's tokens
    old = logp - shift[:, None] - noise
    ref = logp + rng.normal(0.0, 0.3, size=(b, t))
    adv = np.array([-1.0, 0.5, 1.2, 0.8, -0.7, -0.3])
    return logp, old, ref, adv, mask, shift


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_gspo_sequence_ratio_and_loss_match_the_formula(loss_type, beta):
    logp, old, ref, adv, mask, shift = _gspo_inputs()
    eps, eps_high = 3e-4, 4e-4  # GSPO's paper
    s = np.exp(shift)
    assert ((s > 1 + eps_high) & (adv > 0)).any() and ((s < 1 - eps) & (adv < 0)).any()  # both clips occur
    kw = dict(max_len=9 if loss_type == "dr_grpo" else None)
    want = gspo_reference(logp, old, ref, adv, mask, loss_type, eps, eps_high, beta, **kw)

    def f(lp):
        o, r, a, m = (jnp.asarray(x, jnp.float32) for x in (old, ref, adv, mask))
        return grpo_loss(lp, o, r, a, m, epsilon=eps, epsilon_high=eps_high, beta=beta,
                         loss_agg_mode=MODE_FOR[loss_type], max_completion_length=kw["max_len"],
                         importance_sampling_level="sequence")

    (loss, met), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-7)
    # the reported ratio is the sequence ratio on every token
    np.testing.assert_allclose(float(met["ratio_mean"]), (s[:, None] * mask).sum() / mask.sum(), rtol=1e-6)
    low = (s < 1 - eps) & (adv < 0)
    high = (s > 1 + eps_high) & (adv > 0)
    tokens = mask.sum(1)
    np.testing.assert_allclose(float(met["clip_ratio/low_mean"]), (low * tokens).sum() / tokens.sum(), rtol=1e-6)
    np.testing.assert_allclose(float(met["clip_ratio/high_mean"]), (high * tokens).sum() / tokens.sum(), rtol=1e-6)
    # gradient: central differences of the float64 reference
    fd, h = np.zeros_like(logp), 1e-6
    for idx in np.ndindex(*logp.shape):
        up, dn = logp.copy(), logp.copy()
        up[idx] += h
        dn[idx] -= h
        fd[idx] = (gspo_reference(up, old, ref, adv, mask, loss_type, eps, eps_high, beta, **kw)
                   - gspo_reference(dn, old, ref, adv, mask, loss_type, eps, eps_high, beta, **kw)) / (2 * h)
    np.testing.assert_allclose(np.asarray(grad), fd, rtol=2e-3, atol=1e-6)
    # a clipped rollout gets no policy gradient; an unclipped one gets -A s / L on each of its tokens
    if loss_type == "grpo" and beta == 0.0:
        g = np.asarray(grad)
        assert np.all(g[low | high] == 0)
        free = ~(low | high)
        np.testing.assert_allclose(g[free], (-adv * s / tokens / len(adv))[free, None] * mask[free], rtol=1e-4,
                                   atol=1e-9)


def test_gspo_equals_token_level_for_one_token_rollouts_and_errors():
    logp, old, ref, adv, mask, _ = _gspo_inputs()
    one = np.zeros_like(mask)
    one[:, 0] = 1.0
    args = [jnp.asarray(x, jnp.float32) for x in (logp, old, ref, adv, one)]
    tok, _ = grpo_loss(*args, epsilon=3e-4, epsilon_high=4e-4)
    seq, _ = grpo_loss(*args, epsilon=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence")
    assert float(tok) == pytest.approx(float(seq), rel=1e-6)
    with pytest.raises(ValueError, match="importance_sampling_level must be one of"):
        grpo_loss(*args, importance_sampling_level="group")


# ----------------------------------------------------------------------------------------------------
# Truncated importance sampling (TRL's vllm_importance_sampling_mode="token_truncate"):
#   w_it = min(exp(old_it - sampler_it), C); per-token loss = w_it * clipped surrogate_it + beta k3_it
# ----------------------------------------------------------------------------------------------------


def test_truncated_is_weights_match_the_formula():
    old = np.array([[-1.0, -2.0, -0.5, -3.0], [-0.1, -0.2, -9.0, -1.0]])
    sampler = np.array([[-1.0, -3.5, -0.4, -1.0], [-0.1, -0.2, -1.0, 0.0]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float64)
    want = np.minimum(np.exp(old - sampler), 2.0)
    want[mask == 0] = 1.0
    got = np.asarray(truncated_is_weights(*(jnp.asarray(x, jnp.float32) for x in (old, sampler, mask)), cap=2.0))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0, 1] == 2.0 and got[0, 0] == 1.0 and got[1, 2] < 1e-3  # capped, equal, far less likely
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask), cap=0.0)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_corrected_loss_matches_the_formula_and_unit_weights_change_nothing(level):
    from tests.stages.rl.test_grpo import grpo_inputs, ref_per_token

    logp, old, ref, adv, mask = grpo_inputs(seed=6)
    sampler = old + np.random.default_rng(6).normal(0, 0.5, size=old.shape)
    w = np.minimum(np.exp(old - sampler), 2.0)
    args = [jnp.asarray(x, jnp.float32) for x in (old, ref, adv, mask)]
    kw = dict(epsilon=0.2, epsilon_high=0.28, beta=0.04, loss_agg_mode="token-mean", importance_sampling_level=level)
    weights = truncated_is_weights(args[0], jnp.asarray(sampler, jnp.float32), args[3], cap=2.0)

    def f(lp, iw):
        return grpo_loss(lp, *args, **kw, is_weights=iw)[0]

    lp = jnp.asarray(logp, jnp.float32)
    if level == "token":  # the written-out reference
        pg = ref_per_token(logp, old, ref, adv, 0.2, 0.28, 0.0)
        d = ref - logp
        want = ((w * pg + 0.04 * (np.exp(d) - d - 1)) * mask).sum() / mask.sum()
        np.testing.assert_allclose(float(f(lp, weights)), want, rtol=1e-5)
    plain = jax.value_and_grad(lambda x: grpo_loss(x, *args, **kw)[0])(lp)
    ones = jax.value_and_grad(f)(lp, jnp.ones_like(lp))
    assert float(ones[0]) == float(plain[0])
    np.testing.assert_array_equal(np.asarray(ones[1]), np.asarray(plain[1]))
    assert float(f(lp, weights)) != pytest.approx(float(plain[0]))


def test_mismatch_stats_match_the_formula_and_are_zero_when_equal():
    rng = np.random.default_rng(3)
    trainer = -rng.uniform(0.1, 3, size=(3, 5))
    sampler = trainer + rng.normal(0, 0.1, size=(3, 5))
    mask = (np.arange(5)[None] < np.array([5, 2, 4])[:, None]).astype(np.float64)
    sampler_padded = np.where(mask > 0, sampler, -1e9)  # padding may hold anything
    got = {k: float(v) for k, v in mismatch_stats(*(jnp.asarray(x, jnp.float32)
                                                    for x in (trainer, sampler_padded, mask))).items()}
    gap = np.abs(trainer - sampler)[mask > 0]
    d = (trainer - sampler)[mask > 0]  # log trainer / sampler on tokens the sampler drew
    want = [gap.mean(), gap.max(), (np.exp(d) - d - 1).mean()]
    np.testing.assert_allclose([got["mean"], got["max"], got["kl"]], want, rtol=1e-5)
    same = mismatch_stats(*(jnp.asarray(x, jnp.float32) for x in (trainer, trainer, mask)))
    assert all(float(v) == 0.0 for v in same.values())


# ----------------------------------------------------------------------------------------------------
# DAPO (Yu et al., 2025): soft overlong punishment (Eq. 13) and dynamic sampling's zero-variance filter.
# ----------------------------------------------------------------------------------------------------


def test_soft_overlong_penalty_matches_dapo_eq13():
    l_max, cache = 100, 20

    def eq13(n):
        if n <= l_max - cache:
            return 0.0
        if n <= l_max:
            return ((l_max - cache) - n) / cache
        return -1.0

    lengths = np.array([0, 1, 79, 80, 81, 90, 99, 100, 101, 250])
    want = [eq13(n) for n in lengths]
    np.testing.assert_allclose(np.asarray(soft_overlong_penalty(lengths, l_max, cache)), want, rtol=1e-6)
    assert want[5] == -0.5 and want[7] == -1.0  # TRL's example: 90 tokens of 100 with a cache of 20
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(lengths, l_max, 0)
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(lengths, l_max, 101)


def test_zero_variance_filter_with_near_equal_float_rewards():
    f32 = np.float32

    def reward(answer, process, fmt):  # as the stage sums them: float32 weighted parts
        return f32(0) + f32(1.0) * f32(answer) + f32(0.25) * f32(process) + f32(0.1) * f32(fmt)

    # 0.25 * 0.2 + 0.1 * 0.3 and 0.1 * 0.8 are both 0.08: equal when printed, not to the bit
    near = [reward(0, 0.2, 0.3), reward(0, 0, 0.8), reward(0, 0.2, 0.3), reward(0, 0, 0.8)]
    assert len({float(x) for x in near}) == 2 and {f"{x:.6g}" for x in near} == {"0.08"}
    groups = np.array([
        [1.0, 1.0, 1.0, 1.0],  # equal to the bit: dropped
        near,  # equal up to rounding: dropped with a tolerance, kept without
        [0.3, 0.3, 0.3, 0.301],  # a real difference (1e-3): kept
        [0.0, 1.0, 0.0, 0.0],  # kept
    ], np.float32).reshape(-1)
    want = {0.0: [True, False, False, False], 1e-6: [True, True, False, False]}
    for tol, drop in want.items():
        np.testing.assert_array_equal(np.asarray(zero_variance_groups(groups, 4, tol)), drop)
        assert float(zero_std_fraction(groups, 4, tol)) == sum(drop) / 4
    # the written-out reference: max - min <= tol per group
    ref = lambda r, g, tol: (r.reshape(-1, g).max(1) - r.reshape(-1, g).min(1)) <= tol  # noqa: E731
    rng = np.random.default_rng(0)
    r = np.round(rng.uniform(0, 1, 64), 1).astype(np.float32)
    got = np.asarray(zero_variance_groups(r, 2, 0.05))
    np.testing.assert_array_equal(got, ref(r, 2, 0.05))
    assert 0 < got.sum() < len(got)
    with pytest.raises(ValueError, match="tol"):
        zero_variance_groups(groups, 4, -1.0)
