"""DeepEncoder-V2 image side: SAM ViT patch encoder, conv neck, 16x conv compressor.

    images [b, L, L, 3] --patch conv 16/16--> [b, L/16, L/16, D] + abs pos (bicubic-resized)
      --blocks (windowed attention, every (k+1)-th block global; decomposed rel-pos bias)-->
      --neck: 1x1 conv, LayerNorm2d, 3x3 conv, LayerNorm2d--> [b, L/16, L/16, 256]
      --compressor: 3x3/2 conv 256->512, 3x3/2 conv 512->896 (no bias, pad 1)--> V [b, (L/64)^2, 896]

Images are NHWC floats normalised like DeepSeek-OCR-2's processor: `(pixel / 255 - 0.5) / 0.5`,
i.e. [-1, 1] (`PIXEL_MEAN`, `PIXEL_STD`, `normalize_images`). Visual tokens are row-major over the
final grid, as `flatten(2).transpose(1, 2)` gives in the PyTorch reference.

Numerics follow `transformers`' `deepseek_ocr2` SAM encoder exactly (parity tested): the absolute
position table is resized with torch's antialiased bicubic (PIL kernel, a = -0.5), rel-pos tables
with torch's linear (align_corners=False); windowed blocks zero-pad the grid to a multiple of the
window *after* the first LayerNorm and do not mask the padding. Both resizes are written as constant
matrices built in NumPy at trace time (shapes are static), so they cost one small einsum.

Layers are scanned. Windowed and global blocks have different rel-pos table lengths, so they live in
two stacks; the config must be periodic (k windowed blocks then one global, repeated), which SAM
ViT-B/L/H all are. The forward is a scan over groups whose body scans the k windowed blocks and then
runs the group's global block: two compiled block bodies whatever the depth.
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
from dlr_jax.models.grid_attention import SCORES_BUDGET, grid_attention
from dlr_jax.models.transformer import remat_fn

PIXEL_MEAN = (0.5, 0.5, 0.5)  # DeepSeek-OCR-2 processor (IMAGENET_STANDARD_MEAN/STD in transformers)
PIXEL_STD = (0.5, 0.5, 0.5)


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """SAM ViT + neck + compressor. Defaults are DeepEncoder V2 (SAM ViT-B at 1024 px)."""

    image_size: int = 1024  # reference size: abs-pos grid and global rel-pos tables are built for it
    patch_size: int = 16
    num_channels: int = 3
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    global_attn_indexes: tuple[int, ...] = (2, 5, 8, 11)
    window_size: int = 14
    qkv_bias: bool = True
    layer_norm_eps: float = 1e-6
    neck_channels: int = 256
    compressor_channels: tuple[int, ...] = (512, 896)
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"  # none | full | dots

    def __post_init__(self) -> None:
        # YAML gives lists; keep the config hashable.
        object.__setattr__(self, "global_attn_indexes", tuple(int(i) for i in self.global_attn_indexes))
        object.__setattr__(self, "compressor_channels", tuple(int(c) for c in self.compressor_channels))
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"vision.hidden_size={self.hidden_size} not divisible by num_heads={self.num_heads}"
            )
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"vision.image_size={self.image_size} not a multiple of patch_size={self.patch_size}"
            )
        if len(self.compressor_channels) != 2:
            raise ConfigError(f"vision.compressor_channels needs 2 entries, got {self.compressor_channels}")
        g = self.global_attn_indexes
        if self.window_size < 1 and len(g) != self.num_layers:
            raise ConfigError("vision.window_size must be >= 1 unless every block is global")
        k = g[0] if g else self.num_layers
        expected = tuple((j + 1) * (k + 1) - 1 for j in range(len(g)))
        if g != expected or self.num_layers != (len(g) * (k + 1) if g else k):
            raise ConfigError(
                f"vision.global_attn_indexes={g} with num_layers={self.num_layers}: blocks must form "
                f"groups of k windowed + 1 global (e.g. k=2: (2, 5, 8, 11) for 12 layers)"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_global(self) -> int:
        return len(self.global_attn_indexes)

    @property
    def num_windowed(self) -> int:
        return self.num_layers - self.num_global

    @property
    def out_channels(self) -> int:
        return self.compressor_channels[-1]

    def num_tokens(self, height: int, width: int | None = None) -> int:
        """Visual tokens for an image: each stride-2 conv (pad 1, kernel 3) gives ceil(n / 2)."""
        width = height if width is None else width
        gh, gw = height // self.patch_size, width // self.patch_size
        return math.ceil(math.ceil(gh / 2) / 2) * math.ceil(math.ceil(gw / 2) / 2)


DEEPENCODER_V2_VISION = VisionConfig()
# CPU tests: windows of 3 force grid padding (8 -> 9) and the rel-pos tables need resizing.
TINY_VISION = VisionConfig(
    image_size=128, hidden_size=32, num_layers=4, num_heads=2, mlp_dim=64, global_attn_indexes=(1, 3),
    window_size=3, neck_channels=16, compressor_channels=(24, 32),
)


def normalize_images(pixels: np.ndarray | jax.Array) -> jax.Array:
    """uint8 [b, H, W, 3] (0..255) or float in [0, 1] -> float32 in [-1, 1]."""
    x = jnp.asarray(pixels)
    x = x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)
    return (x - jnp.asarray(PIXEL_MEAN)) / jnp.asarray(PIXEL_STD)


# ----------------------------------------------------------------------------------------------
# Torch-compatible resampling as constant matrices.


@functools.lru_cache(maxsize=64)
def bicubic_aa_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of torch `interpolate(mode="bicubic", antialias=True,
    align_corners=False)` along one axis (PIL's Keys kernel, a = -0.5, widened when shrinking)."""
    a = -0.5
    scale = n_in / n_out
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(n_out) + 0.5)
    x = np.abs((np.arange(n_in)[None, :] + 0.5 - centers[:, None]) * inv)
    inner = ((a + 2) * x - (a + 3)) * x * x + 1
    outer = (((x - 5) * x + 8) * x - 4) * a
    w = np.where(x < 1, inner, np.where(x < 2, outer, 0.0))
    return w / w.sum(axis=1, keepdims=True)


@functools.lru_cache(maxsize=64)
def linear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of torch `interpolate(mode="linear", align_corners=False)`."""
    src = np.maximum(n_in / n_out * (np.arange(n_out) + 0.5) - 0.5, 0.0)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = src - i0
    w = np.zeros((n_out, n_in))
    np.add.at(w, (np.arange(n_out), i0), 1.0 - lam)
    np.add.at(w, (np.arange(n_out), i1), lam)
    return w


@functools.lru_cache(maxsize=64)
def rel_pos_matrix(table_len: int, size: int) -> np.ndarray:
    """[size, size, table_len]: M[q, k] mixes table rows into the embedding of offset q - k, after
    resizing the table to 2 * size - 1 rows (SAM's `get_rel_pos` with q_size == k_size)."""
    resize = linear_matrix(table_len, 2 * size - 1)
    offs = np.arange(size)[:, None] - np.arange(size)[None, :] + size - 1
    return resize[offs]


def resize_pos_embed(pos: Float[Array, "gh gw d"], height: int, width: int) -> Float[Array, "h w d"]:
    if pos.shape[:2] == (height, width):
        return pos
    mh = jnp.asarray(bicubic_aa_matrix(pos.shape[0], height), jnp.float32)
    mw = jnp.asarray(bicubic_aa_matrix(pos.shape[1], width), jnp.float32)
    out = jnp.einsum("yh,hwd,xw->yxd", mh, pos.astype(jnp.float32), mw, precision=jax.lax.Precision.HIGHEST)
    return out.astype(pos.dtype)


# ----------------------------------------------------------------------------------------------
# Pure building blocks.


def layer_norm(x: jax.Array, w: jax.Array, b: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mu = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
    y = (x32 - mu) * jax.lax.rsqrt(var + eps)
    return (y * w.astype(jnp.float32) + b.astype(jnp.float32)).astype(x.dtype)


def conv2d(
    x: Float[Array, "b h w ci"], kernel: Float[Array, "kh kw ci co"], stride: int, pad: int
) -> Float[Array, "b ho wo co"]:
    return jax.lax.conv_general_dilated(
        x, kernel.astype(x.dtype), (stride, stride), ((pad, pad), (pad, pad)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


def sam_attention(
    cfg: VisionConfig, p: Mapping[str, jax.Array], x: Float[Array, "b h w d"],
    scores_budget: int | None = SCORES_BUDGET,
) -> jax.Array:
    """Multi-head self-attention over an h x w grid with decomposed relative position bias
    (`grid_attention`: queries in chunks of grid rows past `scores_budget`)."""
    b, h, w, _ = x.shape
    dt = x.dtype
    q = jnp.einsum("byxd,dnk->byxnk", x, p["q_proj"].astype(dt))
    k = jnp.einsum("byxd,dnk->byxnk", x, p["k_proj"].astype(dt))
    v = jnp.einsum("byxd,dnk->byxnk", x, p["v_proj"].astype(dt))
    if cfg.qkv_bias:
        q, k, v = q + p["q_bias"].astype(dt), k + p["k_bias"].astype(dt), v + p["v_bias"].astype(dt)
    rh = jnp.einsum("qkr,rc->qkc", jnp.asarray(rel_pos_matrix(p["rel_pos_h"].shape[0], h), jnp.float32),
                    p["rel_pos_h"].astype(jnp.float32))
    rw = jnp.einsum("qkr,rc->qkc", jnp.asarray(rel_pos_matrix(p["rel_pos_w"].shape[0], w), jnp.float32),
                    p["rel_pos_w"].astype(jnp.float32))
    out = grid_attention(q, k, v, rh, rw, scores_budget)
    return jnp.einsum("byxnc,ncd->byxd", out, p["o_proj"].astype(dt)) + p["o_bias"].astype(dt)


def window_partition(x: Float[Array, "b h w d"], win: int) -> jax.Array:
    """Zero-pads to multiples of `win`, returns windows [b * nh * nw, win, win, d]."""
    b, h, w, d = x.shape
    ph, pw = -h % win, -w % win
    x = jnp.pad(x, ((0, 0), (0, ph), (0, pw), (0, 0)))
    nh, nw = (h + ph) // win, (w + pw) // win
    x = x.reshape(b, nh, win, nw, win, d).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b * nh * nw, win, win, d)


def window_unpartition(windows: jax.Array, win: int, b: int, h: int, w: int) -> Float[Array, "b h w d"]:
    nh, nw = -(-h // win), -(-w // win)
    x = windows.reshape(b, nh, nw, win, win, -1).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, nh * win, nw * win, -1)[:, :h, :w]


def sam_block(
    cfg: VisionConfig, p: Mapping[str, jax.Array], x: Float[Array, "b h w d"], window: int
) -> Float[Array, "b h w d"]:
    """Pre-LN block; `window` 0 means global attention over the whole grid."""
    b, h, w, _ = x.shape
    y = layer_norm(x, p["ln1_w"], p["ln1_b"], cfg.layer_norm_eps)
    if window:
        y = window_unpartition(sam_attention(cfg, p, window_partition(y, window), None), window, b, h, w)
    else:
        y = sam_attention(cfg, p, y)
    x = constrain(x + y, ("batch", None, None, "act_embed"))
    y = layer_norm(x, p["ln2_w"], p["ln2_b"], cfg.layer_norm_eps)
    y = jnp.einsum("byxd,df->byxf", y, p["fc1"].astype(x.dtype)) + p["fc1_bias"].astype(x.dtype)
    y = constrain(jax.nn.gelu(y, approximate=False), ("batch", None, None, "act_mlp"))
    y = jnp.einsum("byxf,fd->byxd", y, p["fc2"].astype(x.dtype)) + p["fc2_bias"].astype(x.dtype)
    return constrain(x + y, ("batch", None, None, "act_embed"))


def run_blocks(
    cfg: VisionConfig, windowed: Mapping[str, jax.Array], global_: Mapping[str, jax.Array], x: jax.Array
) -> jax.Array:
    """Scans the groups [k windowed, 1 global]; each group's windowed blocks are an inner scan."""
    n_g, n_w = cfg.num_global, cfg.num_windowed

    def win_body(y, p):
        return sam_block(cfg, p, y, cfg.window_size), None

    win_body = remat_fn(win_body, cfg.remat)
    if n_g == 0:
        return jax.lax.scan(win_body, x, dict(windowed))[0]
    k = n_w // n_g
    grouped = {n: a.reshape(n_g, k, *a.shape[1:]) for n, a in windowed.items()} if k else {}

    def group_body(y, ps):
        wp, gp = ps
        if k:
            y, _ = jax.lax.scan(win_body, y, wp)
        return sam_block(cfg, gp, y, 0), None

    return jax.lax.scan(remat_fn(group_body, cfg.remat), x, (grouped, dict(global_)))[0]


# ----------------------------------------------------------------------------------------------
# Parameters.


def new_param(rngs: nnx.Rngs, shape, axes, dtype, init: str = "normal", scale: float = 0.02) -> nnx.Param:
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        if init == "fan_in":  # convs: LeCun normal over kh * kw * c_in
            scale = 1.0 / math.sqrt(math.prod(shape[:-1]))
        value = (scale * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, logical_axes=tuple(axes))


# D-length vectors (biases, LayerNorm) use "norm": replicated, like the decoder's norms.
BLOCK_PARAM_AXES: dict[str, tuple[str, ...]] = {
    "ln1_w": ("layers", "norm"),
    "ln1_b": ("layers", "norm"),
    "q_proj": ("layers", "embed", "q_heads", "head_dim"),
    "k_proj": ("layers", "embed", "q_heads", "head_dim"),
    "v_proj": ("layers", "embed", "q_heads", "head_dim"),
    "q_bias": ("layers", "q_heads", "head_dim"),
    "k_bias": ("layers", "q_heads", "head_dim"),
    "v_bias": ("layers", "q_heads", "head_dim"),
    "o_proj": ("layers", "q_heads", "head_dim", "embed"),
    "o_bias": ("layers", "norm"),
    "rel_pos_h": ("layers", "rel_pos", "head_dim"),
    "rel_pos_w": ("layers", "rel_pos", "head_dim"),
    "ln2_w": ("layers", "norm"),
    "ln2_b": ("layers", "norm"),
    "fc1": ("layers", "embed", "mlp"),
    "fc1_bias": ("layers", "mlp"),
    "fc2": ("layers", "mlp", "embed"),
    "fc2_bias": ("layers", "norm"),
}


class SamBlocks(nnx.Module):
    """`n` blocks stacked on a leading `layers` dim; rel-pos tables have `2 * size - 1` rows."""

    def __init__(self, cfg: VisionConfig, n: int, size: int, *, rngs: nnx.Rngs):
        d, nh, hd, f, r = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, max(2 * size - 1, 1)
        pd = jnp.dtype(cfg.param_dtype)
        shapes = {
            "ln1_w": ((n, d), "ones"), "ln1_b": ((n, d), "zeros"),
            "q_proj": ((n, d, nh, hd), "normal"), "k_proj": ((n, d, nh, hd), "normal"),
            "v_proj": ((n, d, nh, hd), "normal"),
            "o_proj": ((n, nh, hd, d), "normal"), "o_bias": ((n, d), "zeros"),
            "rel_pos_h": ((n, r, hd), "zeros"), "rel_pos_w": ((n, r, hd), "zeros"),
            "ln2_w": ((n, d), "ones"), "ln2_b": ((n, d), "zeros"),
            "fc1": ((n, d, f), "normal"), "fc1_bias": ((n, f), "zeros"),
            "fc2": ((n, f, d), "normal"), "fc2_bias": ((n, d), "zeros"),
        }
        if cfg.qkv_bias:
            shapes |= {k: ((n, nh, hd), "zeros") for k in ("q_bias", "k_bias", "v_bias")}
        self.names = tuple(shapes)
        for name, (shape, init) in shapes.items():
            setattr(self, name, new_param(rngs, shape, BLOCK_PARAM_AXES[name], pd, init))

    def arrays(self) -> dict[str, jax.Array]:
        return {n: getattr(self, n)[...] for n in self.names}


class VisionTower(nnx.Module):
    """`tower(images [b, H, W, 3]) -> V [b, N, compressor_channels[-1]]`, N = ceil(H/64)*ceil(W/64)."""

    def __init__(self, cfg: VisionConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pd = jnp.dtype(cfg.param_dtype)
        p, c, d, n1 = cfg.patch_size, cfg.num_channels, cfg.hidden_size, cfg.neck_channels
        c1, c2 = cfg.compressor_channels
        conv_axes = ("conv_h", "conv_w", "conv_in", "conv_out")
        self.patch_kernel = new_param(rngs, (p, p, c, d), ("conv_h", "conv_w", "conv_in", "embed"), pd, "fan_in")
        self.patch_bias = new_param(rngs, (d,), ("norm",), pd, "zeros")
        self.pos_embed = new_param(rngs, (cfg.grid, cfg.grid, d), ("pos_h", "pos_w", "embed"), pd)
        self.windowed = SamBlocks(cfg, cfg.num_windowed, cfg.window_size, rngs=rngs)
        self.global_ = SamBlocks(cfg, cfg.num_global, cfg.grid, rngs=rngs)
        self.neck_conv1 = new_param(rngs, (1, 1, d, n1), ("conv_h", "conv_w", "embed", "conv_out"), pd, "fan_in")
        self.neck_ln1_w = new_param(rngs, (n1,), ("norm",), pd, "ones")
        self.neck_ln1_b = new_param(rngs, (n1,), ("norm",), pd, "zeros")
        self.neck_conv2 = new_param(rngs, (3, 3, n1, n1), conv_axes, pd, "fan_in")
        self.neck_ln2_w = new_param(rngs, (n1,), ("norm",), pd, "ones")
        self.neck_ln2_b = new_param(rngs, (n1,), ("norm",), pd, "zeros")
        self.down1 = new_param(rngs, (3, 3, n1, c1), conv_axes, pd, "fan_in")
        self.down2 = new_param(rngs, (3, 3, c1, c2), conv_axes, pd, "fan_in")

    def features(self, images: Float[Array, "b H W c"]) -> Float[Array, "b h w d"]:
        """ViT output before the neck, [b, H/16, W/16, hidden_size]."""
        cfg = self.cfg
        if images.ndim != 4 or images.shape[-1] != cfg.num_channels:
            raise ValueError(f"images must be [b, H, W, {cfg.num_channels}] (NHWC), got shape {images.shape}")
        if images.shape[1] % cfg.patch_size or images.shape[2] % cfg.patch_size:
            raise ValueError(
                f"image sides {images.shape[1:3]} must be multiples of patch_size={cfg.patch_size}"
            )
        x = images.astype(jnp.dtype(cfg.dtype))
        x = conv2d(x, self.patch_kernel[...], cfg.patch_size, 0) + self.patch_bias[...].astype(x.dtype)
        x = x + resize_pos_embed(self.pos_embed[...], x.shape[1], x.shape[2]).astype(x.dtype)
        x = constrain(x, ("batch", None, None, "act_embed"))
        return run_blocks(cfg, self.windowed.arrays(), self.global_.arrays(), x)

    def __call__(self, images: Float[Array, "b H W c"]) -> Float[Array, "b n dc"]:
        chex.assert_type(images, float)  # normalised pixels (`normalize_images`), not raw uint8
        eps = self.cfg.layer_norm_eps
        x = self.features(images)
        x = layer_norm(conv2d(x, self.neck_conv1[...], 1, 0), self.neck_ln1_w[...], self.neck_ln1_b[...], eps)
        x = layer_norm(conv2d(x, self.neck_conv2[...], 1, 1), self.neck_ln2_w[...], self.neck_ln2_b[...], eps)
        x = conv2d(conv2d(x, self.down1[...], 2, 1), self.down2[...], 2, 1)
        b, h, w, c = x.shape
        return constrain(x.reshape(b, h * w, c), ("batch", "length", "act_embed"))


# ----------------------------------------------------------------------------------------------
# Loading PyTorch weights (transformers' DeepseekOcr2SamVisionEncoder names).


def set_value(var: nnx.Variable, value: np.ndarray, name: str) -> None:
    old = var.get_value()
    if tuple(old.shape) != tuple(value.shape):
        raise ValueError(f"{name}: checkpoint shape {value.shape} does not match parameter shape {old.shape}")
    new = jnp.asarray(value, old.dtype)
    var.set_value(jax.device_put(new, old.sharding) if hasattr(old, "sharding") else new)


def to_numpy(t: Any) -> np.ndarray:
    return t.detach().cpu().float().numpy() if hasattr(t, "detach") else np.asarray(t, np.float32)


def _block_arrays(cfg: VisionConfig, sd: Mapping[str, Any], pre: str) -> dict[str, np.ndarray]:
    nh, hd, d = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    qkv = to_numpy(sd[pre + "attn.qkv.weight"]).reshape(3, nh, hd, d).transpose(0, 3, 1, 2)  # [3, d, nh, hd]
    out = {
        "ln1_w": to_numpy(sd[pre + "layer_norm1.weight"]), "ln1_b": to_numpy(sd[pre + "layer_norm1.bias"]),
        "q_proj": qkv[0], "k_proj": qkv[1], "v_proj": qkv[2],
        "o_proj": to_numpy(sd[pre + "attn.proj.weight"]).reshape(d, nh, hd).transpose(1, 2, 0),
        "o_bias": to_numpy(sd[pre + "attn.proj.bias"]),
        "rel_pos_h": to_numpy(sd[pre + "attn.rel_pos_h"]), "rel_pos_w": to_numpy(sd[pre + "attn.rel_pos_w"]),
        "ln2_w": to_numpy(sd[pre + "layer_norm2.weight"]), "ln2_b": to_numpy(sd[pre + "layer_norm2.bias"]),
        "fc1": to_numpy(sd[pre + "mlp.lin1.weight"]).T, "fc1_bias": to_numpy(sd[pre + "mlp.lin1.bias"]),
        "fc2": to_numpy(sd[pre + "mlp.lin2.weight"]).T, "fc2_bias": to_numpy(sd[pre + "mlp.lin2.bias"]),
    }
    if cfg.qkv_bias:
        qb = to_numpy(sd[pre + "attn.qkv.bias"]).reshape(3, nh, hd)
        out |= {"q_bias": qb[0], "k_bias": qb[1], "v_bias": qb[2]}
    return out


def load_sam_state_dict(tower: VisionTower, sd: Mapping[str, Any], prefix: str = "") -> None:
    """Copies a `DeepseekOcr2SamVisionEncoder` state dict (torch tensors or arrays; keys after
    `prefix`, e.g. "model.vision_model.sam_encoder.") into `tower`, in place."""
    cfg = tower.cfg
    required = ("patch_embed.projection.weight", "pos_embed", "proj.conv2.weight")
    missing = [k for k in required if prefix + k not in sd]
    if missing:
        raise KeyError(f"state dict lacks {[prefix + k for k in missing]} (is prefix={prefix!r} right?)")
    conv = lambda k: to_numpy(sd[prefix + k]).transpose(2, 3, 1, 0)  # noqa: E731  OIHW -> HWIO
    set_value(tower.patch_kernel, conv("patch_embed.projection.weight"), "patch_embed")
    set_value(tower.patch_bias, to_numpy(sd[prefix + "patch_embed.projection.bias"]), "patch_embed.bias")
    set_value(tower.pos_embed, to_numpy(sd[prefix + "pos_embed"])[0], "pos_embed")
    per_layer = [_block_arrays(cfg, sd, f"{prefix}layers.{i}.") for i in range(cfg.num_layers)]
    glob = set(cfg.global_attn_indexes)
    for stack, idx in ((tower.windowed, [i for i in range(cfg.num_layers) if i not in glob]),
                       (tower.global_, sorted(glob))):
        for name in stack.names:
            set_value(getattr(stack, name), np.stack([per_layer[i][name] for i in idx]), f"layers.*.{name}")
    set_value(tower.neck_conv1, conv("neck.conv1.weight"), "neck.conv1")
    set_value(tower.neck_conv2, conv("neck.conv2.weight"), "neck.conv2")
    for i in (1, 2):
        set_value(getattr(tower, f"neck_ln{i}_w"), to_numpy(sd[f"{prefix}neck.layer_norm{i}.weight"]), f"neck.ln{i}")
        set_value(getattr(tower, f"neck_ln{i}_b"), to_numpy(sd[f"{prefix}neck.layer_norm{i}.bias"]), f"neck.ln{i}")
    set_value(tower.down1, conv("proj.conv1.weight"), "proj.conv1")
    set_value(tower.down2, conv("proj.conv2.weight"), "proj.conv2")
