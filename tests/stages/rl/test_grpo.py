"""GRPO math checked against an independent NumPy (float64) transcription of TRL's GRPOTrainer formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.stages.rl.grpo import aggregate, group_advantages, grpo_loss, k3_kl, zero_std_fraction

# ----------------------------------------------------------------------------------------------------
# NumPy reference of TRL's GRPOTrainer._compute_loss (token-level importance sampling), written from the
# formulas: coef_1 = exp(logp - old), coef_2 = clamp(coef_1, 1 - eps_low, 1 + eps_high),
# per_token = -min(coef_1 * A, coef_2 * A) + beta * k3, then per loss_type:
#   grpo:    mean_i( sum_t(l * m) / max(sum_t m, 1) )
#   bnpo:    sum(l * m) / max(sum m, 1)
#   dr_grpo: sum(l * m) / (B * max_completion_length)
#   dapo:    sum(l * m) / max(num_items_in_batch, 1)
# ----------------------------------------------------------------------------------------------------


def ref_per_token(logp, old, ref, adv, eps_low, eps_high, beta):
    ratio = np.exp(logp - old)
    a = adv[:, None]
    loss = -np.minimum(ratio * a, np.clip(ratio, 1 - eps_low, 1 + eps_high) * a)
    if beta != 0.0:
        d = ref - logp
        loss = loss + beta * (np.exp(d) - d - 1)
    return loss


def ref_weights(mask, loss_type, max_len=None, num_items=None):
    """d loss / d per_token_loss: the aggregation is linear, so it is a fixed weight per token."""
    b = mask.shape[0]
    if loss_type == "grpo":
        return mask / np.maximum(mask.sum(-1, keepdims=True), 1) / b
    if loss_type == "bnpo":
        return mask / max(mask.sum(), 1)
    if loss_type == "dr_grpo":
        return mask / (b * max_len)
    if loss_type == "dapo":
        return mask / max(num_items, 1)
    raise AssertionError(loss_type)


def trl_reference(
    logp, old, ref, adv, mask, loss_type, eps_low, eps_high, beta, max_len=None, num_items=None
):
    per_token = ref_per_token(logp, old, ref, adv, eps_low, eps_high, beta)
    return float((per_token * ref_weights(mask, loss_type, max_len, num_items)).sum())


def trl_reference_grad(
    logp, old, ref, adv, mask, loss_type, eps_low, eps_high, beta, max_len=None, num_items=None
):
    """Analytic d loss / d logp: the unclipped branch gives -A * ratio, a clipped token gives 0."""
    ratio = np.exp(logp - old)
    a = adv[:, None]
    clipped = ((a > 0) & (ratio > 1 + eps_high)) | ((a < 0) & (ratio < 1 - eps_low))
    g = np.where(clipped, 0.0, -a * ratio)
    if beta != 0.0:
        g = g + beta * (1.0 - np.exp(ref - logp))
    return g * ref_weights(mask, loss_type, max_len, num_items)


def grpo_inputs(seed=0, b=6, t=9):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.05, 3.0, size=(b, t))
    # Spread of 0.4 in log space pushes a good share of ratios outside [0.8, 1.28] on both sides.
    old = logp + rng.normal(0.0, 0.4, size=(b, t))
    ref = logp + rng.normal(0.0, 0.3, size=(b, t))
    adv = rng.normal(size=b)
    lengths = np.array([t, 1, 5, t - 2, 3, 7][:b])
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    return logp, old, ref, adv, mask


MODE_FOR = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "dr_grpo"}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("epsilon_high", [None, 0.28])
def test_loss_and_grad_match_trl_reference(loss_type, beta, epsilon_high):
    logp, old, ref, adv, mask = grpo_inputs()
    eps = 0.2
    eps_high = eps if epsilon_high is None else epsilon_high
    max_len = 12  # the generation budget, larger than the padded T=9
    num_items = mask.sum() + 17.0  # as if other micro-batches held 17 more tokens
    kw = dict(
        max_len=max_len if loss_type == "dr_grpo" else None,
        num_items=num_items if loss_type == "dapo" else None,
    )
    want = trl_reference(logp, old, ref, adv, mask, loss_type, eps, eps_high, beta, **kw)
    want_grad = trl_reference_grad(logp, old, ref, adv, mask, loss_type, eps, eps_high, beta, **kw)

    ratio = np.exp(logp - old)
    assert ((ratio > 1 + eps_high) & (mask > 0)).any() and ((ratio < 1 - eps) & (mask > 0)).any()

    def f(lp):
        return grpo_loss(
            lp,
            jnp.asarray(old, jnp.float32),
            None if beta == 0.0 else jnp.asarray(ref, jnp.float32),
            jnp.asarray(adv, jnp.float32),
            jnp.asarray(mask, jnp.float32),
            epsilon=eps,
            epsilon_high=epsilon_high,
            beta=beta,
            loss_agg_mode=loss_type,  # TRL alias
            num_items_in_batch=kw["num_items"],
            max_completion_length=kw["max_len"],
        )

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
    np.testing.assert_allclose(float(loss), want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=2e-4, atol=1e-6)

    # The same numbers through our own names of the modes (MODE_FOR).
    loss2, _ = grpo_loss(
        jnp.asarray(logp, jnp.float32),
        jnp.asarray(old, jnp.float32),
        jnp.asarray(ref, jnp.float32),
        jnp.asarray(adv, jnp.float32),
        jnp.asarray(mask, jnp.float32),
        epsilon=eps,
        epsilon_high=epsilon_high,
        beta=beta,
        loss_agg_mode=MODE_FOR[loss_type],
        num_items_in_batch=kw["num_items"],
        max_completion_length=kw["max_len"],
    )
    np.testing.assert_allclose(float(loss2), want, rtol=2e-5, atol=1e-6)

    # Metrics, with TRL's definitions (masked token means over this batch).
    m = mask > 0
    a = adv[:, None] * np.ones_like(logp)
    low = (ratio < 1 - eps) & (a < 0)
    high = (ratio > 1 + eps_high) & (a > 0)
    np.testing.assert_allclose(float(metrics["clip_ratio/low_mean"]), low[m].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["clip_ratio/high_mean"]), high[m].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["clip_ratio/region_mean"]), (low | high)[m].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["ratio_mean"]), ratio[m].mean(), rtol=1e-5)
    assert float(metrics["num_tokens"]) == mask.sum()
    if beta == 0.0:
        assert "kl" not in metrics
    else:
        d = ref - logp
        np.testing.assert_allclose(float(metrics["kl"]), (np.exp(d) - d - 1)[m].mean(), rtol=1e-5)
    pg_only = trl_reference(logp, old, ref, adv, mask, loss_type, eps, eps_high, 0.0, **kw)
    np.testing.assert_allclose(float(metrics["policy_loss"]), pg_only, rtol=2e-5, atol=1e-6)


def test_analytic_reference_gradient_matches_finite_differences():
    """Validates the NumPy reference gradient itself, so the comparison above is not circular."""
    logp, old, ref, adv, mask = grpo_inputs(seed=3)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        kw = dict(max_len=11, num_items=40.0)
        args = (old, ref, adv, mask, loss_type, 0.2, 0.28, 0.05)
        g = trl_reference_grad(logp, *args, **kw)
        fd = np.zeros_like(logp)
        h = 1e-6
        for idx in np.ndindex(*logp.shape):
            up, dn = logp.copy(), logp.copy()
            up[idx] += h
            dn[idx] -= h
            fd[idx] = (trl_reference(up, *args, **kw) - trl_reference(dn, *args, **kw)) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "dr_grpo"])
def test_on_policy_equals_plain_policy_gradient(mode):
    """mu = 1: old = sg(logp) gives ratio 1, loss -agg(A) and the REINFORCE gradient of -agg(A * logp)."""
    logp, _, _, adv, mask = grpo_inputs(seed=1)
    lp, a, m = (jnp.asarray(x, jnp.float32) for x in (logp, adv, mask))

    def ours(x, use_none):
        old = None if use_none else jax.lax.stop_gradient(x)
        return grpo_loss(x, old, None, a, m, beta=0.0, loss_agg_mode=mode)

    def reinforce(x):
        return aggregate(-a[:, None] * x, m, mode)

    want_value = float(aggregate(-a[:, None] * jnp.ones_like(lp), m, mode))
    want_grad = jax.grad(reinforce)(lp)
    for use_none in (True, False):
        (loss, metrics), grad = jax.value_and_grad(ours, has_aux=True)(lp, use_none)
        np.testing.assert_allclose(float(loss), want_value, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-6, atol=1e-8)
        assert float(metrics["ratio_mean"]) == pytest.approx(1.0)
        assert float(metrics["clip_ratio/region_mean"]) == 0.0


def test_padding_log_probs_cannot_poison_the_loss():
    """Padded positions may hold -1e9 (a pad id outside the vocab mask) or 0 (a masked reference):
    exp() of their difference is inf, and inf * 0 would make the loss and gradient NaN (seen in a
    latent GRPO run). Values and gradients must equal those with clean padding."""
    logp, old, ref, adv, mask = grpo_inputs(seed=2)
    lp, o, r, a, m = (jnp.asarray(x, jnp.float32) for x in (logp, old, ref, adv, mask))
    pad = m == 0
    assert bool(pad.any())

    def loss(x, o, r):
        return grpo_loss(x, o, r, a, m, beta=0.04, epsilon=0.2)[0]

    clean = jax.value_and_grad(loss)(lp, o, r)
    dirty = jax.value_and_grad(loss)(jnp.where(pad, -1e9, lp), jnp.where(pad, -1e9, o), jnp.where(pad, 0.0, r))
    assert np.isfinite(float(dirty[0])) and np.isfinite(np.asarray(dirty[1])).all()
    np.testing.assert_allclose(float(dirty[0]), float(clean[0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(dirty[1]), np.asarray(clean[1]), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "dr_grpo"])
def test_micro_batches_with_global_denominator_sum_to_full_batch(mode):
    logp, old, ref, adv, mask = grpo_inputs(seed=2)
    args = [jnp.asarray(x, jnp.float32) for x in (logp, old, ref, adv, mask)]
    kw = dict(beta=0.04, epsilon_high=0.28, loss_agg_mode=mode, max_completion_length=10)
    parts = ((0, 2), (2, logp.shape[0]))  # unequal token counts: 10 vs 20 tokens
    glob = dict(num_items_in_batch=float(mask.sum()), num_sequences=logp.shape[0])

    @jax.jit
    def full_loss(lp):
        return grpo_loss(lp, *args[1:], **kw)[0]

    @jax.jit
    def summed_loss(lp):
        return sum(grpo_loss(lp[a:b], *(x[a:b] for x in args[1:]), **kw, **glob)[0] for a, b in parts)

    @jax.jit
    def local_mean_loss(lp):  # each part normalised by its own size, then averaged
        return sum(grpo_loss(lp[a:b], *(x[a:b] for x in args[1:]), **kw)[0] for a, b in parts) / 2

    lp = args[0]
    np.testing.assert_allclose(float(summed_loss(lp)), float(full_loss(lp)), rtol=1e-6)
    g_full, g_sum = jax.grad(full_loss)(lp), jax.grad(summed_loss)(lp)
    np.testing.assert_allclose(np.asarray(g_sum), np.asarray(g_full), rtol=1e-5, atol=1e-8)
    if mode == "token-mean":
        # Without the global count each part averages over its own tokens: a different (biased) number.
        assert abs(float(local_mean_loss(lp)) - float(full_loss(lp))) > 1e-4


def test_loss_options_and_errors():
    logp, old, ref, adv, mask = (jnp.asarray(x, jnp.float32) for x in grpo_inputs(seed=4))
    # epsilon_high defaults to epsilon.
    a, _ = grpo_loss(logp, old, ref, adv, mask, epsilon=0.1)
    b, _ = grpo_loss(logp, old, ref, adv, mask, epsilon=0.1, epsilon_high=0.1)
    assert float(a) == float(b)
    # ref_logps with beta=0 only feeds the metric; the loss equals the no-ref loss.
    c, mc = grpo_loss(logp, old, ref, adv, mask, beta=0.0)
    d, md = grpo_loss(logp, old, None, adv, mask, beta=0.0)
    assert float(c) == float(d) and "kl" in mc and "kl" not in md
    # Per-token advantages equal to broadcast per-sequence ones give the same loss.
    default, _ = grpo_loss(logp, old, ref, adv, mask)
    e, _ = grpo_loss(logp, old, ref, jnp.broadcast_to(adv[:, None], logp.shape), mask)
    np.testing.assert_allclose(float(e), float(default), rtol=1e-7)
    # Entropy metric and bf16 inputs (upcast to fp32 inside).
    ent = jnp.abs(logp)
    loss16, m16 = grpo_loss(logp.astype(jnp.bfloat16), old, ref, adv, mask, entropies=ent)
    assert loss16.dtype == jnp.float32
    np.testing.assert_allclose(float(m16["entropy"]), float((ent * mask).sum() / mask.sum()), rtol=1e-6)
    # jit with static options.
    jitted = jax.jit(grpo_loss, static_argnames=("epsilon", "epsilon_high", "beta", "loss_agg_mode"))
    np.testing.assert_allclose(float(jitted(logp, old, ref, adv, mask)[0]), float(default), rtol=1e-6)
    with pytest.raises(ValueError, match="needs ref_logps"):
        grpo_loss(logp, old, None, adv, mask, beta=0.01)
    with pytest.raises(ValueError, match="loss_agg_mode must be one of"):
        grpo_loss(logp, old, ref, adv, mask, loss_agg_mode="sum")
    with pytest.raises(ValueError, match="mask must have the shape"):
        grpo_loss(logp, old, ref, adv, mask[:, :3])
    with pytest.raises(ValueError, match="advantages must be"):
        grpo_loss(logp, old, ref, adv[:3], mask)


def test_k3_is_nonnegative_and_zero_at_equality():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    assert float(jnp.min(k3_kl(x, y))) >= 0.0
    assert float(jnp.max(jnp.abs(k3_kl(x, x)))) == 0.0


def test_k3_stays_finite_for_a_token_pushed_far_below_the_reference():
    # seed 4 of the half-font recipe: after three updates a malformed rollout's token sat at -115 nats against
    # the reference's -3.3, exp(111.8) overflowed and RL stopped with an inf loss
    logp = jnp.asarray([[-115.07, -2.0, -1.0]], jnp.float32)
    ref = jnp.asarray([[-3.29, -2.5, -0.4]], jnp.float32)
    kl = np.asarray(k3_kl(logp, ref))
    assert np.isfinite(kl).all()
    d = np.asarray(ref - logp)[0, 1:]  # ordinary tokens: the exact estimator
    np.testing.assert_allclose(kl[0, 1:], np.exp(d) - d - 1.0, rtol=1e-6)
    adv, mask = jnp.asarray([-2.47]), jnp.ones((1, 3), jnp.float32)
    loss, grads = jax.value_and_grad(lambda lp: grpo_loss(lp, logp, ref, adv, mask, beta=1e-3)[0])(logp)
    assert np.isfinite(float(loss)) and np.isfinite(np.asarray(grads)).all()


def _np_advantages(r, g, scale, eps=1e-4):
    grp = r.reshape(-1, g)
    centred = grp - grp.mean(1, keepdims=True)
    if scale == "group":
        return (centred / (grp.std(1, ddof=1, keepdims=True) + eps)).reshape(-1)
    if scale == "batch":
        return (centred / (r.std(ddof=1) + eps)).reshape(-1)
    return centred.reshape(-1)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_numpy_ddof1(scale):
    rng = np.random.default_rng(5)
    r = rng.normal(size=24).astype(np.float32)
    r[8:12] = 0.1  # a zero-variance group (0.1 is not exact in binary: the mean is off by float noise)
    r[16:20] = 1.0
    got = np.asarray(group_advantages(jnp.asarray(r), 4, scale=scale))
    want = _np_advantages(r.astype(np.float64), 4, scale)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.all(got[8:12] == 0.0) and np.all(got[16:20] == 0.0)
    assert float(zero_std_fraction(jnp.asarray(r), 4)) == pytest.approx(2 / 6)


def test_group_advantages_binary_rewards_and_errors():
    r = jnp.asarray([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = np.asarray(group_advantages(r, 4))
    # Group 1: mean 0.25, unbiased std 0.5 -> the correct rollout gets 0.75 / 0.5001.
    np.testing.assert_allclose(adv[:4], np.array([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-4), rtol=1e-6)
    assert np.all(adv[4:] == 0.0)
    jitted = jax.jit(group_advantages, static_argnames=("group_size", "scale"))
    np.testing.assert_allclose(np.asarray(jitted(r, group_size=4)), adv, rtol=1e-6)
    # group_size 1 (e.g. eval with one sample): no baseline signal, all zeros, no NaN.
    assert np.all(np.asarray(group_advantages(r, 1)) == 0.0)
    with pytest.raises(ValueError, match="groups of group_size=3"):
        group_advantages(r, 3)
    with pytest.raises(ValueError, match="scale must be one of"):
        group_advantages(r, 4, scale="rank")
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(r.reshape(2, 4), 4)
