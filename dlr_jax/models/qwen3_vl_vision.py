"""Qwen3-VL's native vision tower (transformers' `Qwen3VLVisionModel`), for one static image per row.

    images [b, H, W, 3] --patch embed (Conv3d over temporal_patch_size frames, as a matmul)-->
      [b, H/p, W/p, D] + learned positions (the square table bilinearly resized to the grid)
      --blocks (pre-LN, global bidirectional attention with 2D axial RoPE, GELU-tanh MLP)-->
      --merger: LayerNorm, every m x m patches concatenated, Linear-GELU-Linear-->
      [b, (H/(p m)) * (W/(p m)), out_hidden_size]

Images are NHWC floats normalised like Qwen3-VL's processor, `(pixel / 255 - 0.5) / 0.5` (the
same [-1, 1] as `vision.normalize_images`). A still image is one frame that HF's processor repeats
`temporal_patch_size` times, so the Conv3d over identical frames is a 2D patch matmul with the kernel
summed over its temporal taps; the kernel keeps HF's temporal taps, so a checkpoint imports as is.

Token order: the merged tokens are row-major over the (H/(p m)) x (W/(p m)) grid of merge blocks, and
inside a block the m x m patches are concatenated row-major: HF's processor order, so `__call__`
equals HF's `pooler_output`. Inside the tower the patches stay row-major over the patch grid
(attention is over all patches of an image and each patch carries its own (row, col) rotary angles, so
the order HF packs them in changes nothing). The DeepStack mergers feed intermediate features into
the Qwen3-VL LM, not the final tokens: they are not part of this tower (`convert.qwen3_vl_vision` skips
their tensors). Layers are scanned.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from dlr_jax.config import ConfigError
from dlr_jax.core.sharding import constrain
from dlr_jax.models.transformer import remat_fn
from dlr_jax.models.vision import layer_norm, new_param

# HF activation names the blocks' MLP may use, as jax functions (the merger always uses exact GELU).
ACTIVATIONS = {
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "silu": jax.nn.silu,
}


@dataclasses.dataclass(frozen=True)
class Qwen3VLVisionConfig:
    """Field names and defaults are transformers' `Qwen3VLVisionConfig`'s (rope_theta: its axial
    `rope_parameters`)."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-6  # HF hard-codes it for every LayerNorm of the tower
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"  # none | full | dots

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"qwen3_vl vision: hidden_size={self.hidden_size} not divisible by "
                              f"num_heads={self.num_heads}")
        if self.head_dim % 4:
            raise ConfigError(f"qwen3_vl vision: head_dim={self.head_dim} must be a multiple of 4 (2D axial RoPE "
                              "rotates a quarter of it per axis, twice)")
        if math.isqrt(self.num_position_embeddings) ** 2 != self.num_position_embeddings:
            raise ConfigError(f"qwen3_vl vision: num_position_embeddings={self.num_position_embeddings} must be a "
                              "square (a side x side table)")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"qwen3_vl vision: hidden_act {self.hidden_act!r} is not supported "
                              f"(supported: {', '.join(ACTIVATIONS)})")
        for key in ("depth", "patch_size", "temporal_patch_size", "spatial_merge_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"qwen3_vl vision: {key}={getattr(self, key)} must be >= 1")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def pos_side(self) -> int:
        return math.isqrt(self.num_position_embeddings)

    @property
    def merged_size(self) -> int:
        return self.hidden_size * self.spatial_merge_size**2

    @property
    def token_stride(self) -> int:
        """Pixels per merged token along a side: patch_size x spatial_merge_size."""
        return self.patch_size * self.spatial_merge_size

    def num_tokens(self, height: int, width: int | None = None) -> int:
        width = height if width is None else width
        return (height // self.token_stride) * (width // self.token_stride)


# vision_config keys read as they are (the rest of an HF vision_config does not change the tower's maths)
HF_KEYS = ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
           "temporal_patch_size", "spatial_merge_size", "out_hidden_size", "num_position_embeddings", "hidden_act")


def config_from_hf(vision_config: Mapping[str, Any], **overrides: Any) -> Qwen3VLVisionConfig:
    """An HF `qwen3_vl` config.json's `vision_config` dict -> the tower's config; missing keys take
    transformers' defaults; `overrides` set fields afterwards (dtype, param_dtype, remat). ConfigError
    for what the tower does not do."""
    values: dict[str, Any] = {k: vision_config[k] for k in HF_KEYS if vision_config.get(k) is not None}
    for k in ("patch_size", "temporal_patch_size"):
        if isinstance(values.get(k), list | tuple):
            if len(set(values[k])) != 1:
                raise ConfigError(f"vision_config.{k}={values[k]}: only square patches are supported")
            values[k] = values[k][0]
    rope = vision_config.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise ConfigError(f"vision_config rope_type {rope['rope_type']!r} is not supported (axial)")
    if "rope_theta" in rope:
        values["rope_theta"] = float(rope["rope_theta"])
    try:
        return Qwen3VLVisionConfig(**{**values, **overrides})
    except TypeError as e:
        raise ConfigError(f"qwen3_vl vision: {e}") from None


# CPU tests: patch 4 and a 4 x 4 position table, so any test grid resizes it.
TINY_QWEN3_VL_VISION = Qwen3VLVisionConfig(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, out_hidden_size=48,
    num_position_embeddings=16,
)


# ----------------------------------------------------------------------------------------------
# Constant position tables (the grid is static, so these are NumPy at trace time).


@functools.lru_cache(maxsize=64)
def bilinear_align_corners_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of torch `interpolate(mode="bilinear", align_corners=True)` along one axis:
    output i samples input position i * (n_in - 1) / (n_out - 1) (HF's resize of the position table)."""
    src = np.arange(n_out) * (n_in - 1) / max(n_out - 1, 1)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = src - i0
    w = np.zeros((n_out, n_in))
    np.add.at(w, (np.arange(n_out), i0), 1.0 - lam)
    np.add.at(w, (np.arange(n_out), i1), lam)
    return w


@functools.lru_cache(maxsize=64)
def axial_rope_angles(h: int, w: int, head_dim: int, theta: float) -> np.ndarray:
    """[h, w, head_dim] rotary angles of each patch: a quarter of the frequencies turn with the row,
    the next quarter with the column, and the half repeats (rotate-half pairs dims i and i + hd/2)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim // 2, 2, dtype=np.float32) / (head_dim // 2))
    rows = np.broadcast_to(np.arange(h, dtype=np.float32)[:, None, None] * inv_freq, (h, w, inv_freq.size))
    cols = np.broadcast_to(np.arange(w, dtype=np.float32)[None, :, None] * inv_freq, (h, w, inv_freq.size))
    half = np.concatenate([rows, cols], axis=-1)
    return np.concatenate([half, half], axis=-1).astype(np.float32)


def apply_axial_rope(x: Float[Array, "b h w n c"], angles: np.ndarray) -> Float[Array, "b h w n c"]:
    """x * cos + rotate_half(x) * sin, in fp32 as HF does."""
    a = jnp.asarray(angles)[None, :, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * jnp.cos(a) + rotated * jnp.sin(a)).astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Blocks.


def vision_block(
    cfg: Qwen3VLVisionConfig, p: Mapping[str, jax.Array], x: Float[Array, "b h w d"], angles: np.ndarray
) -> Float[Array, "b h w d"]:
    """x + attn(norm1(x)), then + mlp(norm2(x)); attention is global over the image's patches."""
    b, h, w, d = x.shape
    dt, eps = x.dtype, cfg.layer_norm_eps
    y = layer_norm(x, p["ln1_w"], p["ln1_b"], eps)
    q, k, v = (jnp.einsum("byxd,dnc->byxnc", y, p[f"{n}_proj"].astype(dt)) + p[f"{n}_bias"].astype(dt)
               for n in "qkv")
    q, k = apply_axial_rope(q, angles), apply_axial_rope(k, angles)
    flat = lambda t: t.reshape(b, h * w, cfg.num_heads, cfg.head_dim)  # noqa: E731
    o = jax.nn.dot_product_attention(flat(q), flat(k), flat(v), scale=cfg.head_dim**-0.5)
    y = jnp.einsum("bync,ncd->byd", o, p["o_proj"].astype(dt)) + p["o_bias"].astype(dt)
    x = constrain(x + y.reshape(b, h, w, d), ("batch", None, None, "act_embed"))
    y = layer_norm(x, p["ln2_w"], p["ln2_b"], eps)
    y = jnp.einsum("byxd,df->byxf", y, p["fc1"].astype(dt)) + p["fc1_bias"].astype(dt)
    y = constrain(ACTIVATIONS[cfg.hidden_act](y), ("batch", None, None, "act_mlp"))
    y = jnp.einsum("byxf,fd->byxd", y, p["fc2"].astype(dt)) + p["fc2_bias"].astype(dt)
    return constrain(x + y, ("batch", None, None, "act_embed"))


BLOCK_PARAM_AXES: dict[str, tuple[str, ...]] = {
    "ln1_w": ("layers", "norm"), "ln1_b": ("layers", "norm"),
    "q_proj": ("layers", "embed", "q_heads", "head_dim"), "k_proj": ("layers", "embed", "q_heads", "head_dim"),
    "v_proj": ("layers", "embed", "q_heads", "head_dim"),
    "q_bias": ("layers", "q_heads", "head_dim"), "k_bias": ("layers", "q_heads", "head_dim"),
    "v_bias": ("layers", "q_heads", "head_dim"),
    "o_proj": ("layers", "q_heads", "head_dim", "embed"), "o_bias": ("layers", "norm"),
    "ln2_w": ("layers", "norm"), "ln2_b": ("layers", "norm"),
    "fc1": ("layers", "embed", "mlp"), "fc1_bias": ("layers", "mlp"),
    "fc2": ("layers", "mlp", "embed"), "fc2_bias": ("layers", "norm"),
}


class VisionBlocks(nnx.Module):
    """`depth` blocks stacked on a leading `layers` dim (HF's qkv split into q, k, v per head)."""

    def __init__(self, cfg: Qwen3VLVisionConfig, *, rngs: nnx.Rngs):
        n, d, nh, hd, f = cfg.depth, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
        pd = jnp.dtype(cfg.param_dtype)
        shapes = {
            "ln1_w": ((n, d), "ones"), "ln1_b": ((n, d), "zeros"),
            **{f"{c}_proj": ((n, d, nh, hd), "normal") for c in "qkv"},
            **{f"{c}_bias": ((n, nh, hd), "zeros") for c in "qkv"},
            "o_proj": ((n, nh, hd, d), "normal"), "o_bias": ((n, d), "zeros"),
            "ln2_w": ((n, d), "ones"), "ln2_b": ((n, d), "zeros"),
            "fc1": ((n, d, f), "normal"), "fc1_bias": ((n, f), "zeros"),
            "fc2": ((n, f, d), "normal"), "fc2_bias": ((n, d), "zeros"),
        }
        self.names = tuple(shapes)
        for name, (shape, init) in shapes.items():
            setattr(self, name, new_param(rngs, shape, BLOCK_PARAM_AXES[name], pd, init))

    def arrays(self) -> dict[str, jax.Array]:
        return {n: getattr(self, n)[...] for n in self.names}


class Qwen3VLVisionTower(nnx.Module):
    """`tower(images [b, H, W, 3]) -> [b, (H/(p m)) * (W/(p m)), out_hidden_size]` (HF's merged tokens)."""

    def __init__(self, cfg: Qwen3VLVisionConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pd = jnp.dtype(cfg.param_dtype)
        t, p, c, d, md = cfg.temporal_patch_size, cfg.patch_size, cfg.in_channels, cfg.hidden_size, cfg.merged_size
        # [t, p, p, c, d]: HF's Conv3d weight [d, c, t, p, p] with the taps first; a still image sums over t
        scale = 1.0 / math.sqrt(t * p * p * c)
        self.patch_kernel = new_param(rngs, (t, p, p, c, d), (None, "conv_h", "conv_w", "conv_in", "embed"), pd,
                                      scale=scale)
        self.patch_bias = new_param(rngs, (d,), ("norm",), pd, "zeros")
        self.pos_embed = new_param(rngs, (cfg.num_position_embeddings, d), (None, "embed"), pd)
        self.blocks = VisionBlocks(cfg, rngs=rngs)
        self.merger_ln_w = new_param(rngs, (d,), ("norm",), pd, "ones")
        self.merger_ln_b = new_param(rngs, (d,), ("norm",), pd, "zeros")
        self.merger_fc1 = new_param(rngs, (md, md), ("embed", "mlp"), pd, scale=1.0 / math.sqrt(md))
        self.merger_fc1_bias = new_param(rngs, (md,), ("mlp",), pd, "zeros")
        self.merger_fc2 = new_param(rngs, (md, cfg.out_hidden_size), ("mlp", "embed"), pd, scale=1.0 / math.sqrt(md))
        self.merger_fc2_bias = new_param(rngs, (cfg.out_hidden_size,), ("norm",), pd, "zeros")

    def positions(self, h: int, w: int) -> Float[Array, "h w d"]:
        """The learned table resized to an h x w patch grid (bilinear, corners aligned), as HF does."""
        s = self.cfg.pos_side
        table = self.pos_embed[...].astype(jnp.float32).reshape(s, s, -1)
        mh = jnp.asarray(bilinear_align_corners_matrix(s, h), jnp.float32)
        mw = jnp.asarray(bilinear_align_corners_matrix(s, w), jnp.float32)
        return jnp.einsum("ys,std,xt->yxd", mh, table, mw, precision=jax.lax.Precision.HIGHEST)

    def features(self, images: Float[Array, "b H W c"]) -> Float[Array, "b h w d"]:
        """The last block's output (HF's `last_hidden_state`), [b, H/p, W/p, hidden_size], row-major."""
        cfg = self.cfg
        s = cfg.token_stride
        if images.ndim != 4 or images.shape[-1] != cfg.in_channels:
            raise ValueError(f"images must be [b, H, W, {cfg.in_channels}] (NHWC), got shape {images.shape}")
        if images.shape[1] % s or images.shape[2] % s:
            raise ValueError(f"image sides {images.shape[1:3]} must be multiples of patch_size x spatial_merge_size"
                             f" = {s}")
        b, hh, ww, c = images.shape
        p, h, w = cfg.patch_size, hh // cfg.patch_size, ww // cfg.patch_size
        dt = jnp.dtype(cfg.dtype)
        x = images.astype(dt).reshape(b, h, p, w, p, c)
        kernel = self.patch_kernel[...].astype(jnp.float32).sum(axis=0).astype(dt)
        x = jnp.einsum("byixjc,ijcd->byxd", x, kernel) + self.patch_bias[...].astype(dt)
        x = constrain(x + self.positions(h, w).astype(dt), ("batch", None, None, "act_embed"))
        angles = axial_rope_angles(h, w, cfg.head_dim, cfg.rope_theta)
        body = remat_fn(lambda y, bp: (vision_block(cfg, bp, y, angles), None), cfg.remat)
        return jax.lax.scan(body, x, self.blocks.arrays())[0]

    def merge(self, x: Float[Array, "b h w d"]) -> Float[Array, "b n o"]:
        """HF's patch merger: LayerNorm, the m x m patches of each block concatenated, Linear-GELU-Linear."""
        cfg = self.cfg
        b, h, w, d = x.shape
        m, dt = cfg.spatial_merge_size, x.dtype
        x = layer_norm(x, self.merger_ln_w[...], self.merger_ln_b[...], cfg.layer_norm_eps)
        x = x.reshape(b, h // m, m, w // m, m, d).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, m * m * d)
        x = jnp.einsum("bnk,kf->bnf", x, self.merger_fc1[...].astype(dt)) + self.merger_fc1_bias[...].astype(dt)
        x = jax.nn.gelu(x, approximate=False)
        x = jnp.einsum("bnf,fo->bno", x, self.merger_fc2[...].astype(dt)) + self.merger_fc2_bias[...].astype(dt)
        return constrain(x, ("batch", "length", "act_embed"))

    def __call__(self, images: Float[Array, "b H W c"]) -> Float[Array, "b n o"]:
        chex.assert_type(images, float)  # normalised pixels, not raw uint8
        return self.merge(self.features(images))
