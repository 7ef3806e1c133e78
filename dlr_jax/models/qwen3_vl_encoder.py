"""The codebook's encoder with Qwen3-VL's vision tower in place of DeepEncoder V2 (`codebook.encoder: qwen3_vl`).

    image [b, L, L, 3] --Qwen3VLVisionTower--> merged tokens [b, (L/32)^2, o]   (patch 16, 2 x 2 merge)
      --the g x g tokens of each 64-px cell concatenated (g = 64 / 32)--> [b, (L/64)^2, g*g*o]
      --linear--> H [b, N, d_c],   N = (L/64)^2

Why concatenate to 64-px cells: the paper's N = (L/64)^2 counts the latent tokens a canvas gives, and the
encoder table compares encoders at the same N (so the latent sequences the LM learns have the same length).
The tower's own tokens are 4x as many; concatenating each cell's (a learned space-to-depth, like the tower's
own merger) keeps all they carry, where a mean would blur the cell's four quarters. There is no causal flow:
the cell tokens are H.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from dlr_jax.config import ConfigError
from dlr_jax.core.sharding import constrain
from dlr_jax.models.qwen3_vl_vision import Qwen3VLVisionConfig, Qwen3VLVisionTower
from dlr_jax.models.vision import new_param
from dlr_jax.text.render import PATCH


@dataclasses.dataclass(frozen=True)
class Qwen3VLEncoderConfig:
    """tower: the vision tower; code_dim: d_c; num_queries: the most codes a canvas may give (the OCR decoder's
    prefix budget, `codebook.num_queries`, as the DeepEncoder's query pool)."""

    tower: Qwen3VLVisionConfig = dataclasses.field(default_factory=Qwen3VLVisionConfig)
    code_dim: int = 896
    num_queries: int = 256

    def __post_init__(self) -> None:
        if PATCH % self.tower.token_stride:
            raise ConfigError(f"qwen3_vl encoder: a merged token covers {self.tower.token_stride} px, which must "
                              f"divide the {PATCH}-px cell of one code")
        if self.code_dim < 1 or self.num_queries < 1:
            raise ConfigError(f"qwen3_vl encoder: code_dim={self.code_dim} and num_queries={self.num_queries} "
                              "must be >= 1")

    @property
    def out_dim(self) -> int:
        return self.code_dim

    @property
    def cell(self) -> int:
        """Merged tokens per side of a 64-px cell."""
        return PATCH // self.tower.token_stride

    @property
    def cell_dim(self) -> int:
        return self.cell**2 * self.tower.out_hidden_size


class Qwen3VLEncoder(nnx.Module):
    """`encoder(images [b, L, L, 3]) -> H [b, (L/64)^2, d_c]`; images normalised to [-1, 1]
    (`vision.normalize_images`, Qwen3-VL's processor's mean and std), one size per batch."""

    def __init__(self, cfg: Qwen3VLEncoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.tower = Qwen3VLVisionTower(cfg.tower, rngs=rngs)
        self.code_proj = new_param(rngs, (cfg.cell_dim, cfg.code_dim), ("embed", "latent_dim"),
                                   jnp.dtype(cfg.tower.param_dtype), scale=1.0 / math.sqrt(cfg.cell_dim))

    def __call__(self, images: Float[Array, "b H W c"]) -> Float[Array, "b n dc"]:
        b, hh, ww, _ = images.shape
        if hh % PATCH or ww % PATCH:
            raise ValueError(f"image sides {(hh, ww)} must be multiples of {PATCH} (one code per {PATCH}-px cell)")
        g, s = self.cfg.cell, self.cfg.tower.token_stride
        x = self.tower(images)  # [b, (hh/s) * (ww/s), o], row-major
        h, w = hh // PATCH, ww // PATCH
        x = x.reshape(b, h, g, w, g, -1).transpose(0, 1, 3, 2, 4, 5).reshape(b, h * w, -1)
        assert x.shape[-1] == self.cfg.cell_dim and hh // s == h * g
        out = jnp.einsum("bnk,kc->bnc", x, self.code_proj[...].astype(x.dtype))
        return constrain(out, ("batch", "length", "act_embed"))
