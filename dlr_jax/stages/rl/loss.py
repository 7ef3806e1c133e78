"""Stage rl's loss: teacher-forced policy log-probs and the clipped-ratio + k3-KL GRPO objective in
the trainer's `(loss_sum, weight, metric_sums)` form (`grpo.grpo_loss` does the maths)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dlr_jax.stages.rl import grpo


def policy_logprobs(
    model: Any, tokens: jax.Array, attention_mask: jax.Array, *, temperature: float, vocab_mask: Any = None,
    chunk: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced `log_softmax(masked_logits / T)[token]` and the entropy of that distribution,
    both [b, t] aligned with `tokens` (0 where t or t-1 is padding) — the numbers `Sampler.score`
    and the sampler report, so ratios start at 1."""
    from dlr_jax.models.vocab_chunks import next_token_stats

    mask = attention_mask.astype(jnp.int32)
    # Over sequence chunks (models/vocab_chunks.py): no [b, s, vocab] fp32 logits; the entropy is
    # only reported (no gradient).
    stats = next_token_stats(model, tokens, {"attention_mask": mask}, vocab_mask=vocab_mask, temperature=temperature,
                             entropy=True, chunk=chunk)
    lp, ent = stats.logp, stats.entropy
    ok = (mask[:, 1:] > 0) & (mask[:, :-1] > 0)
    pad = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), jnp.where(ok, x, 0.0)], axis=1)
    return pad(lp), pad(ent)


def make_grpo_loss(
    *,
    temperature: float,
    vocab_mask: Any = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 1e-3,
    loss_agg_mode: str = "token-mean",
    max_completion_length: int = 1,
    importance_sampling_level: str = "token",
    sampler_is_correction: str = "off",
    sampler_is_cap: float = 3.0,
):
    """A `Trainer` loss: `loss_fn(model, batch, rng) -> (loss_sum, weight, metric_sums)`.

    batch: tokens, attention_mask [b, s] int32; completion_mask, old_logps [b, s] f32; advantages [b];
    ref_logps [b, s] (needed when beta != 0). Without old_logps the old policy is the current one
    (`stop_gradient` of the log-probs: ratio exactly 1, the gradient of the two-pass loss), which is
    exact when each rollout batch gets a single optimizer step (mu = 1, one minibatch): the stage then
    skips its old-policy scoring pass. `sampler_logps` [b, s] (optional: the sampling copy's log-probs of
    its tokens) adds the sampler/trainer mismatch `logprob_gap/mean`, `logprob_gap/max` (|log-probs -
    sampler's|, the max per micro-batch) and `logprob_gap/kl` (k3 estimate of KL(sampler || trainer));
    with `sampler_is_correction="truncated"` it is required, and each token's surrogate is weighted by
    `min(exp(old - sampler), sampler_is_cap)` (`grpo.truncated_is_weights`; logged: `sampler_is/mean`, the
    share of tokens at the cap `sampler_is/capped`). `importance_sampling_level`: token | sequence (GSPO).
    `grpo.grpo_loss` is called with unit denominators so it returns a *sum*; the matching global
    denominator is the weight the trainer adds over micro-batches:
    completion tokens (token-mean: TRL dapo/bnpo), sequences (seq-mean-token-mean: TRL grpo) or
    sequences x max_completion_length (dr_grpo). Metrics come back as means x weight.
    """
    mode = grpo.resolve_mode(loss_agg_mode)
    if sampler_is_correction not in ("off", "truncated"):
        raise ValueError(f"sampler_is_correction must be off | truncated, got {sampler_is_correction!r}")
    vm = None if vocab_mask is None else jnp.asarray(vocab_mask, bool)

    def loss_fn(model, batch, rng):
        del rng
        logps, ent = policy_logprobs(
            model, batch["tokens"], batch["attention_mask"], temperature=temperature, vocab_mask=vm
        )
        mask = batch["completion_mask"].astype(jnp.float32)
        ref = batch.get("ref_logps")
        old = batch.get("old_logps")
        if old is None:  # on policy by construction: no second forward pass for the same numbers
            old = jax.lax.stop_gradient(logps)
        sampler = batch.get("sampler_logps")
        is_w = None
        if sampler_is_correction == "truncated":
            if sampler is None:
                raise ValueError("sampler_is_correction=truncated needs the sampler's log-probs "
                                 "(batch['sampler_logps'])")
            is_w = grpo.truncated_is_weights(old, sampler, mask, sampler_is_cap)
        loss, met = grpo.grpo_loss(
            logps, old, ref, batch["advantages"], mask, epsilon=epsilon,
            epsilon_high=epsilon_high, beta=beta, loss_agg_mode=mode, num_items_in_batch=1.0,
            num_sequences=1.0, max_completion_length=1, entropies=ent,
            importance_sampling_level=importance_sampling_level, is_weights=is_w,
        )
        n_seq = jnp.float32(mask.shape[0])
        weight = {"token-mean": mask.sum(), "seq-mean-token-mean": n_seq,
                  "dr_grpo": n_seq * max_completion_length}[mode]
        sums = {k: (v if k == "policy_loss" else v * weight) for k, v in met.items() if k != "num_tokens"}
        if sampler is not None:
            sums |= {f"logprob_gap/{k}": v * weight for k, v in grpo.mismatch_stats(logps, sampler, mask).items()}
        if is_w is not None:
            tokens = jnp.maximum(mask.sum(), 1.0)
            sums["sampler_is/mean"] = (is_w * mask).sum() / tokens * weight
            sums["sampler_is/capped"] = ((is_w >= sampler_is_cap) * mask).sum() / tokens * weight
        return loss, weight, sums

    return loss_fn
