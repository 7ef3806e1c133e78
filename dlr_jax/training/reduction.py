"""How a stage's loss is normalised (`TrainConfig.loss_reduction`), in the trainer's `(loss_sum, weight,
metrics)` form (training/trainer.py optimises Σ loss_sum / Σ weight over a step's micro-batches).

    mean   weight = target tokens: the CE per token (per character in the codebook stage), the VQ terms per
           element of the [b, N, d_c] features.
    sum    weight = examples: the paper's equations, written as sums over one example (its CE summed over its
           tokens, its VQ terms summed over its N latents' squared norms), averaged over the examples of the
           global batch.

Either way loss_sum is a plain sum over the micro-batch, so gradient accumulation gives the full batch's
gradient exactly (the weight is a count). The losses also put `tokens` in their metrics, so the logged metric
means stay per token whichever reduction is optimised.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.config.stages import LOSS_REDUCTIONS


def check_reduction(reduction: str) -> None:
    """A loss function's `reduction` argument is one of `LOSS_REDUCTIONS` (the config checks its key too)."""
    if reduction not in LOSS_REDUCTIONS:
        raise ValueError(f"loss reduction must be one of {'|'.join(LOSS_REDUCTIONS)}, got {reduction!r}")


def count_examples(mask: Bool[Array, "b t"], seg: Int[Array, "b t"]) -> Float[Array, ""]:
    """The examples (segments) holding at least one target, as float32: mask marks the targets, seg their
    segment ids (> 0). A packed row holds each example as one contiguous run, so a target starts a new example
    where its segment differs from the previous target's in the row."""
    b, t = mask.shape
    pos = jnp.where(mask, jnp.arange(t)[None, :], -1)
    last = jax.lax.cummax(pos, axis=1)  # the latest target at or before each position
    prev = jnp.concatenate([jnp.full((b, 1), -1, last.dtype), last[:, :-1]], axis=1)
    prev_seg = jnp.where(prev >= 0, jnp.take_along_axis(seg, jnp.maximum(prev, 0), axis=1), -1)
    return jnp.sum((mask & (seg != prev_seg)).astype(jnp.float32))


def vq_weights(h: Float[Array, "b n d"], ntok: Float[Array, ""], reduction: str) -> tuple[Array, Array]:
    """(the trainer's weight, the factor of `quantize`'s per-element VQ means in the loss sum) for features h
    and ntok target tokens. mean: (ntok, ntok): the VQ terms stay per-element means next to the per-token CE.
    sum: (b, b * N * d): the means are over the b * N * d elements, so the factor turns them into sums of every
    image's N squared norms ||h_i - c_{a_i}||^2, and the weight averages those over the images."""
    check_reduction(reduction)
    if reduction == "mean":
        return ntok, ntok
    return jnp.float32(h.shape[0]), jnp.float32(math.prod(h.shape))
