"""Causal flow: a Qwen2-style transformer over [V ; Q_{1:N}] and the full DeepEncoder-V2 `Encoder`.

The sequence is the N_v visual tokens V followed by the first N rows of a learnable query pool.
Hybrid mask (`hybrid_mask`): visual tokens attend to each other bidirectionally and never to
queries; query i attends to every visual token and to queries 0..i. The output H is the query side
of the final-normed hidden states, [b, N, d_c].

RoPE positions are 0..N_v+N-1 in sequence order (visual tokens first), as DeepSeek-OCR-2 does.
Any N in 1..pool_size runs: the pool is truncated to its first N rows. Because the mask is causal
on the query side, the first N outputs of a run with more queries equal a run with exactly N, so
this matches DeepSeek-OCR-2, which always feeds its whole 144- or 256-row table.

Batches with mixed lengths can be padded: `visual_valid` / `query_valid` mark real tokens; real
visual tokens must come first in each row (left-aligned) and queries are placed right after the
padded visual block. Padded keys are masked out and each row's query positions start at its own
count of valid visual tokens, so a padded row gives the same real outputs as an unpadded run.
`Encoder` itself takes one image size per batch (batches are bucketed by canvas side), so it needs
no padding.

The layer stack is `transformer.DecoderLayers` / `run_layers` with `attention_bias=True` (q/k/v
biases, as Qwen2) and an explicit [b, t, t] mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.config import ConfigError, ModelConfig
from dlr_jax.core.sharding import constrain
from dlr_jax.models.transformer import DecoderLayers, new_param, rms_norm, run_layers
from dlr_jax.models.vision import (
    DEEPENCODER_V2_VISION,
    TINY_VISION,
    VisionConfig,
    VisionTower,
    load_sam_state_dict,
    set_value,
    to_numpy,
)


@dataclasses.dataclass(frozen=True)
class CausalFlowConfig:
    """Defaults are DeepEncoder V2's Qwen2-0.5B-shaped flow."""

    hidden_size: int = 896
    intermediate_size: int = 4864
    num_layers: int = 24
    num_heads: int = 14
    num_kv_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    num_queries: int = 256  # query pool size; any N <= this runs
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"  # none | full | dots
    attention: str = "auto"  # auto | xla | cudnn (einsum = xla): see attention.resolve_attention
    # Adds visual token i to query i's output (N queries = N visual tokens). Not in DeepEncoder V2,
    # whose flow starts from a pretrained LM: a *randomly initialised* flow's query outputs barely
    # depend on the image (the query pool dominates), the OCR decoder learns to ignore them, and the
    # encoder never learns to read (BENCHMARKS.md, codebook diagnosis). The shortcut gives the
    # decoder the compressor tokens from step 0 while the flow learns to refine them.
    visual_skip: bool = False

    def __post_init__(self) -> None:
        if self.num_queries < 1:
            raise ConfigError(f"flow.num_queries must be >= 1, got {self.num_queries}")
        self.model_config()  # validates heads / remat / attention

    def model_config(self) -> ModelConfig:
        return ModelConfig(
            model_type="qwen2", vocab_size=1, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_layers=self.num_layers, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, attention_bias=True, dtype=self.dtype, param_dtype=self.param_dtype,
            remat=self.remat, attention=self.attention,
        )


DEEPENCODER_V2_FLOW = CausalFlowConfig()
TINY_FLOW = CausalFlowConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=8, rope_theta=10000.0)


def hybrid_mask(
    visual_valid: Bool[Array, "b nv"], query_valid: Bool[Array, "b n"]
) -> Bool[Array, "b t t"]:
    """[b, t, t] (t = nv + n), True = may attend. Visual rows see valid visual keys; query row i
    sees valid visual keys and valid queries 0..i."""
    nv, n = visual_valid.shape[1], query_valid.shape[1]
    t = nv + n
    is_q = jnp.arange(t) >= nv
    causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
    # Visual keys are open to every row; query keys only to query rows, causally.
    allowed = ~is_q[None, :] | (is_q[:, None] & causal)
    key_valid = jnp.concatenate([visual_valid, query_valid], axis=1).astype(bool)
    return allowed[None] & key_valid[:, None, :]


def flow_positions(visual_valid: Bool[Array, "b nv"], n: int) -> Int[Array, "b t"]:
    """Visual token j -> j; query i -> (valid visual tokens in the row) + i."""
    b, nv = visual_valid.shape
    n_vis = jnp.sum(visual_valid.astype(jnp.int32), axis=1, keepdims=True)
    vis = jnp.broadcast_to(jnp.arange(nv, dtype=jnp.int32), (b, nv))
    return jnp.concatenate([vis, n_vis + jnp.arange(n, dtype=jnp.int32)[None, :]], axis=1)


class CausalFlow(nnx.Module):
    """`flow(V [b, nv, d], n_queries=None) -> H [b, N, d]` (N defaults to nv)."""

    def __init__(self, cfg: CausalFlowConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.model_cfg = cfg.model_config()
        pd = jnp.dtype(cfg.param_dtype)
        self.layers = DecoderLayers(self.model_cfg, rngs=rngs)
        self.final_norm = new_param(rngs, (cfg.hidden_size,), ("norm",), pd, "ones")
        self.query_pool = new_param(rngs, (cfg.num_queries, cfg.hidden_size), ("queries", "embed"), pd)

    def hidden_states(
        self,
        visual: Float[Array, "b nv d"],
        n_queries: int | None = None,
        *,
        visual_valid: Bool[Array, "b nv"] | None = None,
        query_valid: Bool[Array, "b n"] | None = None,
    ) -> Float[Array, "b t d"]:
        """Final-normed hidden states of the whole sequence [V ; Q_{1:N}], t = nv + N."""
        cfg = self.cfg
        b, nv, d = visual.shape
        n = nv if n_queries is None else int(n_queries)
        if d != cfg.hidden_size:
            raise ValueError(f"visual tokens have width {d}, the flow expects hidden_size={cfg.hidden_size}")
        if not 1 <= n <= cfg.num_queries:
            raise ValueError(f"n_queries={n} must be in 1..{cfg.num_queries} (the query pool size)")
        dt = jnp.dtype(cfg.dtype)
        queries = jnp.broadcast_to(self.query_pool[...][:n].astype(dt), (b, n, d))
        x = constrain(jnp.concatenate([visual.astype(dt), queries], axis=1), ("batch", "length", "act_embed"))
        vv = jnp.ones((b, nv), bool) if visual_valid is None else visual_valid.astype(bool)
        qv = jnp.ones((b, n), bool) if query_valid is None else query_valid.astype(bool)
        if vv.shape != (b, nv) or qv.shape != (b, n):
            raise ValueError(f"visual_valid {vv.shape} / query_valid {qv.shape} must be {(b, nv)} / {(b, n)}")
        h, _ = run_layers(self.model_cfg, self.layers.arrays(), x, flow_positions(vv, n), hybrid_mask(vv, qv))
        return rms_norm(h, self.final_norm[...], cfg.rms_norm_eps)

    def __call__(
        self,
        visual: Float[Array, "b nv d"],
        n_queries: int | None = None,
        *,
        visual_valid: Bool[Array, "b nv"] | None = None,
        query_valid: Bool[Array, "b n"] | None = None,
    ) -> Float[Array, "b n d"]:
        h = self.hidden_states(visual, n_queries, visual_valid=visual_valid, query_valid=query_valid)
        return h[:, visual.shape[1]:]


# ----------------------------------------------------------------------------------------------
# The whole encoder.


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """code_dim: d_c, the width of the features H. 0 = the flow's width (DeepEncoder V2: d_c = 896 = the
    causal flow's hidden size); another value adds a linear map flow width -> d_c after the flow, so d_c
    and the flow's (pretrained) shape are separate settings."""

    vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
    flow: CausalFlowConfig = dataclasses.field(default_factory=CausalFlowConfig)
    code_dim: int = 0

    def __post_init__(self) -> None:
        if self.vision.out_channels != self.flow.hidden_size:
            raise ConfigError(
                f"vision.compressor_channels[-1]={self.vision.out_channels} must equal "
                f"flow.hidden_size={self.flow.hidden_size}"
            )
        if self.code_dim < 0:
            raise ConfigError(f"code_dim must be >= 0 (0 = the flow width), got {self.code_dim}")

    @property
    def out_dim(self) -> int:
        return self.code_dim or self.flow.hidden_size

    @property
    def num_queries(self) -> int:
        """The most codes a canvas may give: the query pool's rows."""
        return self.flow.num_queries


DEEPENCODER_V2 = EncoderConfig(DEEPENCODER_V2_VISION, DEEPENCODER_V2_FLOW)
TINY_ENCODER = EncoderConfig(TINY_VISION, TINY_FLOW)


class Encoder(nnx.Module):
    """`encoder(images [b, L, L, 3]) -> H [b, N, d_c]`, N = (L/64)^2; images normalised to [-1, 1]
    (`vision.normalize_images`), one size per batch."""

    def __init__(self, cfg: EncoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.vision = VisionTower(cfg.vision, rngs=rngs)
        self.flow = CausalFlow(cfg.flow, rngs=rngs)
        if cfg.out_dim != cfg.flow.hidden_size:
            w = cfg.flow.hidden_size
            self.code_proj = new_param(rngs, (w, cfg.out_dim), ("embed", "latent_dim"), jnp.dtype(cfg.flow.param_dtype),
                                    scale=1.0 / np.sqrt(w))

    def __call__(self, images: Float[Array, "b H W c"]) -> Float[Array, "b n dc"]:
        visual = self.vision(images)
        out = self.flow(visual)
        out = out + visual if self.cfg.flow.visual_skip else out
        if self.cfg.out_dim != self.cfg.flow.hidden_size:
            out = jnp.einsum("bnw,wc->bnc", out, self.code_proj[...].astype(out.dtype))
        return out


def build_encoder(cfg: EncoderConfig, seed: int = 0) -> Encoder:
    return Encoder(cfg, rngs=nnx.Rngs(params=seed))


# ----------------------------------------------------------------------------------------------
# Loading PyTorch weights (transformers' Qwen2Model / DeepseekOcr2VisionEncoder names).


def load_flow_state_dict(
    flow: CausalFlow, sd: Mapping[str, Any], prefix: str = "", query_table: str | None = None
) -> None:
    """Copies Qwen2-named layer weights (`layers.{i}.self_attn.q_proj.weight`, ..., `norm.weight`,
    keys after `prefix`) into `flow`, in place. `query_table` is the full key of a [pool, d] query
    table (e.g. "model.vision_model.query_1024_resolution.weight"); None leaves the pool as is."""
    c = flow.cfg
    d, h, kv, hd = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim

    def heads(name: str, n: int) -> np.ndarray:  # [n*hd, d] -> [d, n, hd]
        return to_numpy(sd[name]).reshape(n, hd, d).transpose(2, 0, 1)

    def one(i: int) -> dict[str, np.ndarray]:
        p = f"{prefix}layers.{i}."
        a = p + "self_attn."
        return {
            "attn_norm": to_numpy(sd[p + "input_layernorm.weight"]),
            "q_proj": heads(a + "q_proj.weight", h), "k_proj": heads(a + "k_proj.weight", kv),
            "v_proj": heads(a + "v_proj.weight", kv),
            "q_bias": to_numpy(sd[a + "q_proj.bias"]).reshape(h, hd),
            "k_bias": to_numpy(sd[a + "k_proj.bias"]).reshape(kv, hd),
            "v_bias": to_numpy(sd[a + "v_proj.bias"]).reshape(kv, hd),
            "o_proj": to_numpy(sd[a + "o_proj.weight"]).reshape(d, h, hd).transpose(1, 2, 0),
            "mlp_norm": to_numpy(sd[p + "post_attention_layernorm.weight"]),
            "gate_proj": to_numpy(sd[p + "mlp.gate_proj.weight"]).T,
            "up_proj": to_numpy(sd[p + "mlp.up_proj.weight"]).T,
            "down_proj": to_numpy(sd[p + "mlp.down_proj.weight"]).T,
        }

    first = f"{prefix}layers.0.input_layernorm.weight"
    if first not in sd:
        raise KeyError(f"state dict lacks {first} (is prefix={prefix!r} right?)")
    per_layer = [one(i) for i in range(c.num_layers)]
    for name in flow.layers.names:
        set_value(getattr(flow.layers, name), np.stack([lay[name] for lay in per_layer]), f"layers.*.{name}")
    set_value(flow.final_norm, to_numpy(sd[prefix + "norm.weight"]), "norm")
    if query_table is not None:
        set_value(flow.query_pool, to_numpy(sd[query_table]), query_table)


def load_hf_vision_state_dict(
    encoder: Encoder, sd: Mapping[str, Any], prefix: str = "", query_table: str | None = None
) -> None:
    """Loads a `DeepseekOcr2VisionModel` state dict (`sam_encoder.*`, `vision_encoder.*`,
    `query_{768,1024}_resolution.weight`, after `prefix`). The query table defaults to the one whose
    row count equals `flow.num_queries` (256 -> query_1024_resolution, 144 -> query_768_resolution)."""
    load_sam_state_dict(encoder.vision, sd, prefix + "sam_encoder.")
    if query_table is None:
        by_rows = {to_numpy(sd[k]).shape[0]: k for k in (prefix + "query_768_resolution.weight",
                                                     prefix + "query_1024_resolution.weight") if k in sd}
        rows = encoder.cfg.flow.num_queries
        if rows not in by_rows:
            raise ValueError(f"no query table with {rows} rows (flow.num_queries); have {sorted(by_rows)}")
        query_table = by_rows[rows]
    load_flow_state_dict(encoder.flow, sd, prefix + "vision_encoder.", query_table=query_table)
