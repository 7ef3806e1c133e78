"""Rotary position embedding of the decoders (models/transformer.py, models/ocr2_text.py): the inverse
frequencies, with Llama-3.1's `llama3` and the `linear` scaling, and the rotation in HF's rotate-half
layout."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from dlr_jax.config import ModelConfig


def rope_inv_freq(cfg: ModelConfig) -> jnp.ndarray:
    """Inverse frequencies [head_dim/2], including Llama-3.1 `llama3` scaling."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    rs = dict(cfg.rope_scaling or {})
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind in ("default", None):
        return inv
    if kind == "llama3":
        factor = float(rs["factor"])
        low = float(rs.get("low_freq_factor", 1.0))
        high = float(rs.get("high_freq_factor", 4.0))
        old_len = float(rs.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        low_wavelen = old_len / low
        high_wavelen = old_len / high
        scaled = jnp.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return jnp.where(medium, smoothed, scaled)
    if kind == "linear":
        return inv / float(rs["factor"])
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, llama3, linear)")


def apply_rope(
    x: Float[Array, "b t h hd"], positions: Int[Array, "b t"], inv_freq: Float[Array, " hd2"]
) -> Float[Array, "b t h hd"]:
    """Rotary embedding in the HF rotate-half layout (first half / second half of head_dim)."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, t, hd/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


__all__ = ["apply_rope", "rope_inv_freq"]
