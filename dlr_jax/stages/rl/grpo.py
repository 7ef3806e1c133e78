"""GRPO math as small pure functions: group advantages, the clipped surrogate, k3 KL, loss aggregation, and
what the field added since (DAPO's zero-variance filter and soft overlong penalty, GSPO's sequence-level
ratio, truncated importance weights for the sampler/trainer mismatch).

Semantics follow TRL's ``GRPOTrainer`` (token- or sequence-level importance ratio, ``loss_type`` in
``{"grpo", "bnpo", "dr_grpo", "dapo"}``, ``scale_rewards`` in ``{"group", "batch", "none"}``) so numbers
are comparable with runs made with TRL. Everything here is shape-static and jit-able; the string and
float options (``loss_agg_mode``, ``beta``, ``scale``) are meant to be static arguments.

Shapes: ``b`` = rollouts in the (micro-)batch, ``t`` = completion positions (right-padded, ``mask``
marks real completion tokens).

Gradient accumulation. Every aggregation mode takes an optional *global* denominator
(``num_items_in_batch`` = total completion tokens, ``num_sequences`` = total rollouts, over all
micro-batches and all devices of one optimizer step). With it, summing the per-micro-batch losses gives
exactly the loss of the whole batch, so a trainer can just add micro-batch gradients. This is TRL's
``dapo`` normaliser; TRL's ``grpo``/``bnpo``/``dr_grpo`` instead divide each micro-batch loss by the
number of accumulation steps, which is the same thing only when micro-batches hold equal token counts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

__all__ = [
    "LOSS_AGG_MODES",
    "SCALE_MODES",
    "aggregate",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "mismatch_stats",
    "soft_overlong_penalty",
    "truncated_is_weights",
    "zero_std_fraction",
    "zero_variance_groups",
]

SCALE_MODES = ("group", "batch", "none")
IS_LEVELS = ("token", "sequence")  # importance_sampling_level: per-token ratios (GRPO) or GSPO's sequence ratio
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "dr_grpo")
# TRL's loss_type names, accepted as aliases so configs can say either.
_AGG_ALIASES = {"bnpo": "token-mean", "dapo": "token-mean", "grpo": "seq-mean-token-mean"}


def _grouped(rewards: Array, group_size: int) -> Array:
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards of length {rewards.shape[0]} cannot be split into groups of group_size={group_size}; "
            "rollouts must be ordered as consecutive groups of group_size per prompt"
        )
    return rewards.astype(jnp.promote_types(rewards.dtype, jnp.float32)).reshape(-1, group_size)


def _unbiased_std(x: Array, axis: int | None) -> Array:
    """Bessel-corrected std (torch.std default, TRL's nanstd); 0 where fewer than two values."""
    n = x.size if axis is None else x.shape[axis]
    if n < 2:
        return jnp.zeros_like(x.mean(axis=axis))
    return jnp.std(x, axis=axis, ddof=1)


def group_advantages(
    rewards: Float[Array, " b"], group_size: int, scale: str = "group", eps: float = 1e-4
) -> Float[Array, " b"]:
    """Group-relative advantages ``A_i = (r_i - mean_group) / (std + eps)``.

    Args:
      rewards: ``[B]`` rewards ordered as ``B / group_size`` consecutive groups (rollouts of one prompt
        are adjacent).
      group_size: G, rollouts per prompt.
      scale: ``"group"`` divides by the unbiased std of each group, ``"batch"`` by the unbiased std of the
        whole batch (still centred per group), ``"none"`` only centres (Dr. GRPO).
      eps: added to the std, as TRL's 1e-4.

    Returns ``[B]`` float32 advantages. Groups whose rewards are all equal get exactly 0 (not float
    noise divided by eps): they carry no learning signal.
    """
    if scale not in SCALE_MODES:
        raise ValueError(f"scale must be one of {SCALE_MODES}, got {scale!r}")
    r = _grouped(jnp.asarray(rewards), group_size)
    centred = r - r.mean(axis=1, keepdims=True)
    if scale == "group":
        adv = centred / (_unbiased_std(r, axis=1)[:, None] + eps)
    elif scale == "batch":
        adv = centred / (_unbiased_std(r.reshape(-1), axis=None) + eps)
    else:
        adv = centred
    constant = (r.max(axis=1) == r.min(axis=1))[:, None]
    return jnp.where(constant, 0.0, adv).reshape(-1)


def zero_variance_groups(rewards: Float[Array, " b"], group_size: int, tol: float = 0.0) -> Array:
    """``[B / group_size]`` bool: the groups whose rewards span at most ``tol`` (``max - min <= tol``).

    DAPO's dynamic sampling drops these groups: their advantages are zero (or, for rewards equal only up
    to float rounding, rounding noise divided by the std's eps), so they carry no learning signal. Rewards
    are float sums of weighted parts (``0.1 + 0.2`` is not ``0.3`` to the bit), hence a tolerance rather
    than exact equality; ``tol = 0`` is exact equality."""
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    r = _grouped(jnp.asarray(rewards), group_size)
    return (r.max(axis=1) - r.min(axis=1)) <= tol


def zero_std_fraction(rewards: Float[Array, " b"], group_size: int, tol: float = 0.0) -> Float[Array, ""]:
    """Share of groups whose rewards are all equal (zero advantage, no gradient): a GRPO health metric.
    ``tol``: see :func:`zero_variance_groups` (0 = equal to the bit)."""
    return jnp.mean(zero_variance_groups(rewards, group_size, tol).astype(jnp.float32))


def soft_overlong_penalty(lengths: Array, max_len: int, buffer: int) -> Float[Array, " b"]:
    """DAPO's soft overlong punishment (its Eq. 13), a reward added to the task reward: 0 for a
    completion of at most ``max_len - buffer`` tokens, then falling linearly to -1 at ``max_len``
    (``((max_len - buffer) - length) / buffer``), and -1 beyond ``max_len``. ``lengths``: generated
    tokens per rollout, stop token included; ``buffer``: DAPO's L_cache (4096 of 20480 in the paper)."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"need 0 < buffer <= max_len, got buffer={buffer}, max_len={max_len}")
    n = jnp.asarray(lengths).astype(jnp.float32)
    soft = ((max_len - buffer) - n) / buffer
    return jnp.where(n <= max_len - buffer, 0.0, jnp.where(n <= max_len, soft, -1.0)).astype(jnp.float32)


def truncated_is_weights(
    old_logps: Float[Array, "b t"], sampler_logps: Float[Array, "b t"], mask: Float[Array, "b t"], cap: float
) -> Float[Array, "b t"]:
    """Truncated importance weights for the sampler/trainer mismatch: ``min(exp(old - sampler), cap)``
    per token (1 at padding), with no gradient. Rollouts come from the sampling copy (e.g. bf16) while
    the loss's old policy is the trainer's; this reweights each token by how much likelier the trainer
    finds it than the sampler did, capped (TRL's ``vllm_importance_sampling_mode="token_truncate"``
    with ``vllm_importance_sampling_clip_max=cap``; truncated IS as in Yao et al., 2025)."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    dtype = jnp.promote_types(old_logps.dtype, jnp.float32)
    valid = mask > 0
    d = jnp.where(valid, old_logps.astype(dtype) - sampler_logps.astype(dtype), 0.0)
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(d), cap))


def mismatch_stats(
    trainer_logps: Float[Array, "b t"], sampler_logps: Float[Array, "b t"], mask: Float[Array, "b t"]
) -> dict[str, Array]:
    """How far the sampler's log-probs of its own tokens are from the trainer's, over the masked tokens:
    ``mean`` and ``max`` of ``|trainer - sampler|`` and ``kl``, the k3 estimate of
    KL(sampler || trainer) (the tokens were drawn from the sampler). All 0 when the two agree."""
    dtype = jnp.promote_types(trainer_logps.dtype, jnp.float32)
    mask = mask.astype(dtype)
    valid = mask > 0
    t = jnp.where(valid, trainer_logps.astype(dtype), 0.0)
    s = jnp.where(valid, sampler_logps.astype(dtype), 0.0)
    gap = jax.lax.stop_gradient(jnp.abs(t - s))
    kl = jax.lax.stop_gradient(k3_kl(s, t))
    return {"mean": _masked_mean(gap, mask), "max": jnp.max(gap * mask), "kl": _masked_mean(kl, mask)}


# exp() of a log-ratio above ~88 overflows fp32. A token the policy has pushed that far below the reference
# (seen on the tiny config: a malformed rollout with a negative advantage went from -3.3 to -115 nats in three
# updates) would make the loss inf and stop the run; above this bound the estimator is flat (no gradient),
# as verl's clamped low-variance KL. Tokens within 20 nats of the reference, i.e. all ordinary ones, are exact.
K3_MAX_LOG_RATIO = 20.0


def k3_kl(logps: Float[Array, "b t"], ref_logps: Float[Array, "b t"]) -> Float[Array, "b t"]:
    """Per-token k3 estimator of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0, unbiased),
    with ``ref - logp`` bounded above by `K3_MAX_LOG_RATIO` so that it stays finite."""
    d = jnp.minimum(ref_logps - logps, K3_MAX_LOG_RATIO)
    return jnp.exp(d) - d - 1.0


def resolve_mode(loss_agg_mode: str) -> str:
    mode = _AGG_ALIASES.get(loss_agg_mode, loss_agg_mode)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"loss_agg_mode must be one of {LOSS_AGG_MODES} (or TRL aliases {tuple(_AGG_ALIASES)}), "
            f"got {loss_agg_mode!r}"
        )
    return mode


def aggregate(
    per_token: Float[Array, "b t"],
    mask: Float[Array, "b t"],
    loss_agg_mode: str = "token-mean",
    *,
    num_items_in_batch: Any = None,
    num_sequences: Any = None,
    max_completion_length: int | None = None,
) -> Float[Array, ""]:
    """Reduce a per-token quantity to a scalar.

    * ``token-mean`` (TRL ``bnpo``/``dapo``): ``sum(x * mask) / N`` with ``N = num_items_in_batch`` if
      given (global token count) else the tokens in this batch.
    * ``seq-mean-token-mean`` (TRL ``grpo``): per-sequence token mean, summed over sequences and divided by
      ``num_sequences`` (default: this batch's B). Empty sequences count as 0.
    * ``dr_grpo``: ``sum(x * mask) / (num_sequences * max_completion_length)``; the length defaults to
      ``t``, so pass the generation budget when batches are padded to less than it.
    """
    mode = resolve_mode(loss_agg_mode)
    mask = mask.astype(per_token.dtype)
    masked = per_token * mask
    n_seq = per_token.shape[0] if num_sequences is None else num_sequences
    if mode == "token-mean":
        denom = mask.sum() if num_items_in_batch is None else num_items_in_batch
        return masked.sum() / jnp.maximum(jnp.asarray(denom, per_token.dtype), 1.0)
    if mode == "seq-mean-token-mean":
        seq = masked.sum(axis=-1) / jnp.maximum(mask.sum(axis=-1), 1.0)
        return seq.sum() / jnp.maximum(jnp.asarray(n_seq, per_token.dtype), 1.0)
    length = per_token.shape[-1] if max_completion_length is None else max_completion_length
    return masked.sum() / (jnp.asarray(n_seq, per_token.dtype) * length)


def _masked_mean(x: Array, mask: Array) -> Array:
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def grpo_loss(
    logps: Float[Array, "b t"],
    old_logps: Float[Array, "b t"] | None,
    ref_logps: Float[Array, "b t"] | None,
    advantages: Float[Array, " b"] | Float[Array, "b t"],
    mask: Float[Array, "b t"],
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 1e-3,
    loss_agg_mode: str = "token-mean",
    num_items_in_batch: Any = None,
    num_sequences: Any = None,
    max_completion_length: int | None = None,
    entropies: Float[Array, "b t"] | None = None,
    importance_sampling_level: str = "token",
    is_weights: Float[Array, "b t"] | None = None,
) -> tuple[Float[Array, ""], dict[str, Array]]:
    """Clipped GRPO surrogate plus ``beta`` times k3 KL to the reference policy.

    Per token: ``r = exp(logp - old)``, ``-min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A)
    + beta * k3(logp, ref)``, then aggregated by ``loss_agg_mode`` (see :func:`aggregate`; TRL names
    ``"dapo"``, ``"bnpo"``, ``"grpo"`` are accepted).

    With ``importance_sampling_level="sequence"`` (GSPO, Zheng et al., 2025) every token of rollout i
    takes the same ratio ``s_i = exp(mean_t(logp - old))`` over its masked tokens (the length-normalised
    sequence likelihood ratio; the gradient flows through the mean), clipped as above; GSPO's paper
    pairs it with ``loss_agg_mode="seq-mean-token-mean"`` (then the loss is its per-sequence objective)
    and a clip range of 3e-4 / 4e-4. This is TRL's ``importance_sampling_level``.

    Args:
      logps: current policy log-probs of the sampled completion tokens (differentiate w.r.t. these).
      old_logps: log-probs under the policy that sampled the rollouts. ``None`` means on-policy
        (one inner epoch): ``stop_gradient(logps)``, so the ratio is 1 and the gradient is the plain
        policy gradient.
      ref_logps: reference-policy log-probs; may be ``None`` when ``beta == 0`` (the KL term is then
        skipped entirely). If given with ``beta == 0`` it is only used for the ``kl`` metric.
      advantages: ``[B]`` (broadcast over tokens) or per-token ``[B, T]``.
      mask: ``[B, T]`` 1 for completion tokens that count, 0 for padding.
      epsilon, epsilon_high: lower / upper clip range; ``epsilon_high`` defaults to ``epsilon``
        (DAPO's clip-higher uses e.g. 0.28).
      beta: KL coefficient (a Python float: 0 removes the term from the graph).
      num_items_in_batch, num_sequences, max_completion_length: global denominators, see
        :func:`aggregate`.
      entropies: optional per-token policy entropies, only reported as a metric.
      importance_sampling_level: ``"token"`` (GRPO) or ``"sequence"`` (GSPO), see above.
      is_weights: optional ``[B, T]`` weights (no gradient) multiplying the clipped surrogate per token
        before the KL term is added: the sampler/trainer mismatch correction
        (:func:`truncated_is_weights`, as TRL applies its ``importance_sampling_ratio``). ``None`` = 1.

    Returns ``(loss, metrics)``. Metrics are scalar means over this batch's masked tokens:
    ``policy_loss`` (the clipped surrogate, aggregated like the loss), ``kl`` (when ref_logps is given),
    ``clip_ratio/low_mean`` (ratio < 1-eps with A < 0), ``clip_ratio/high_mean`` (ratio > 1+eps_high with
    A > 0), ``clip_ratio/region_mean`` (either: the tokens whose gradient the clip removed, as TRL),
    ``ratio_mean``, ``entropy`` (if given), ``num_tokens``.
    """
    mode = resolve_mode(loss_agg_mode)
    if importance_sampling_level not in IS_LEVELS:
        raise ValueError(f"importance_sampling_level must be one of {IS_LEVELS}, got {importance_sampling_level!r}")
    if logps.ndim != 2:
        raise ValueError(f"logps must be [B, T], got shape {tuple(logps.shape)}")
    for name, arr in (
        ("old_logps", old_logps),
        ("ref_logps", ref_logps),
        ("mask", mask),
        ("entropies", entropies),
        ("is_weights", is_weights),
    ):
        if arr is not None and tuple(arr.shape) != tuple(logps.shape):
            raise ValueError(
                f"{name} must have the shape of logps {tuple(logps.shape)}, got {tuple(arr.shape)}"
            )
    if advantages.shape not in ((logps.shape[0],), tuple(logps.shape)):
        raise ValueError(
            f"advantages must be [B]={logps.shape[0]} or [B, T]={tuple(logps.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    use_kl = not (isinstance(beta, int | float) and beta == 0)
    if use_kl and ref_logps is None:
        raise ValueError(f"beta={beta} needs ref_logps; pass ref_logps or set beta=0.0")
    eps_high = epsilon if epsilon_high is None else epsilon_high

    # Ratios of probabilities in bf16 lose most of their precision near 1; work in >= fp32.
    dtype = jnp.promote_types(logps.dtype, jnp.float32)
    logps = logps.astype(dtype)
    old = jax.lax.stop_gradient(logps) if old_logps is None else old_logps.astype(dtype)
    mask = mask.astype(dtype)
    adv = advantages.astype(dtype)
    if adv.ndim == 1:
        adv = adv[:, None]
    # Padding positions may hold any log-prob (a pad id outside the vocab mask scores ~ -1e9, a
    # masked reference 0): exp() of their difference is inf, and inf * 0 in the aggregation is NaN
    # in the loss and the gradient. Zero them before any exp; real tokens are untouched.
    valid = mask > 0
    logps = jnp.where(valid, logps, 0.0)
    old = jnp.where(valid, old, 0.0)
    if ref_logps is not None:
        ref_logps = jnp.where(valid, ref_logps.astype(dtype), 0.0)

    log_ratio = logps - old
    if importance_sampling_level == "sequence":  # one ratio per rollout, on each of its tokens
        seq = (log_ratio * mask).sum(axis=-1, keepdims=True) / jnp.maximum(mask.sum(axis=-1, keepdims=True), 1.0)
        log_ratio = jnp.broadcast_to(seq, logps.shape)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + eps_high)
    pg = -jnp.minimum(ratio * adv, clipped * adv)
    if is_weights is not None:
        pg = pg * jax.lax.stop_gradient(is_weights.astype(dtype))
    per_token = pg
    kl = None
    if ref_logps is not None:
        kl = k3_kl(logps, ref_logps.astype(dtype))
        if use_kl:
            per_token = pg + beta * kl

    agg = dict(
        loss_agg_mode=mode,
        num_items_in_batch=num_items_in_batch,
        num_sequences=num_sequences,
        max_completion_length=max_completion_length,
    )
    loss = aggregate(per_token, mask, **agg)

    low = ((ratio < 1.0 - epsilon) & (adv < 0)).astype(dtype)
    high = ((ratio > 1.0 + eps_high) & (adv > 0)).astype(dtype)
    stop = jax.lax.stop_gradient
    metrics: dict[str, Array] = {
        "policy_loss": stop(aggregate(pg, mask, **agg)),
        "clip_ratio/low_mean": _masked_mean(low, mask),
        "clip_ratio/high_mean": _masked_mean(high, mask),
        "clip_ratio/region_mean": _masked_mean(jnp.maximum(low, high), mask),
        "ratio_mean": stop(_masked_mean(ratio, mask)),
        "num_tokens": mask.sum(),
    }
    if kl is not None:
        metrics["kl"] = stop(_masked_mean(kl, mask))
    if entropies is not None:
        metrics["entropy"] = stop(_masked_mean(entropies.astype(dtype), mask))
    return loss, metrics
