"""DeepSeek-OCR-2's language model: a DeepSeek-V2-style MoE decoder with standard multi-head
attention (transformers' `DeepseekOcr2TextModel` replaces DeepSeek-V2's MLA by Llama-style q/k/v/o
projections and rotate-half RoPE; no biases), dense MLPs where `mlp_layer_types[i] == "dense"` and
the MoE MLP of models/moe.py where it is "sparse".

Attention weights are stacked over all layers; dense-MLP weights over the dense layers and MoE weights
over the sparse layers. The forward scans each maximal run of same-type layers (the real model is one
dense layer then 11 sparse ones: two scans), so compile time does not grow with depth.

Decoding: `init_cache` / `trunk_cached` / `forward_cached` are the interface `generate.sampler.Sampler` drives
(jitted prefill, then a `while_loop` over one token a step, KV cache [layers, b, kv, s, hd]); the image
prefix goes in as embedding rows (`ocr2_reader.Ocr2Reader`). Greedy tokens equal transformers' `generate`
(tests/models/test_ocr2.py).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.config import ConfigError, ModelConfig
from dlr_jax.core.sharding import constrain
from dlr_jax.models.embedding import lookup_rows
from dlr_jax.models.moe import MoeConfig, MoeLayers, moe_forward
from dlr_jax.models.rope import apply_rope, rope_inv_freq
from dlr_jax.models.transformer import (
    LAYER_PARAM_AXES,
    KVCache,
    attention,
    causal_mask,
    default_segments_positions,
    dense,
    remat_fn,
    rms_norm,
    write_kv_cache,
)
from dlr_jax.models.transformer import new_param as param

ATTN_NAMES = ("attn_norm", "q_proj", "k_proj", "v_proj", "o_proj", "mlp_norm")
DENSE_NAMES = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class Ocr2TextConfig:
    """`base` holds the attention / dense-MLP / vocabulary shape (intermediate_size = dense MLP)."""

    base: ModelConfig
    moe: MoeConfig
    mlp_layer_types: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp_layer_types", tuple(self.mlp_layer_types))
        if len(self.mlp_layer_types) != self.base.num_layers:
            raise ConfigError(f"mlp_layer_types has {len(self.mlp_layer_types)} entries for "
                              f"{self.base.num_layers} layers")
        if set(self.mlp_layer_types) - {"dense", "sparse"}:
            raise ConfigError(f"mlp_layer_types entries must be dense|sparse: {self.mlp_layer_types}")
        if self.moe.hidden_size != self.base.hidden_size:
            raise ConfigError("moe.hidden_size must equal the decoder hidden_size")

    @property
    def runs(self) -> tuple[tuple[str, int, int, int], ...]:
        """(type, first layer, end layer, index of the first layer within its type's stack)."""
        out, start, seen = [], 0, {"dense": 0, "sparse": 0}
        for kind, group in itertools.groupby(self.mlp_layer_types):
            n = len(list(group))
            out.append((kind, start, start + n, seen[kind]))
            start, seen[kind] = start + n, seen[kind] + n
        return tuple(out)

    def count(self, kind: str) -> int:
        return sum(1 for t in self.mlp_layer_types if t == kind)


def attention_block(
    cfg: ModelConfig, p: dict[str, jax.Array], x: Float[Array, "b t d"], positions: Int[Array, "b t"],
    mask: Bool[Array, "b t s"], inv_freq: jax.Array, kv: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    cache_index: jax.Array | None = None,
) -> tuple[Float[Array, "b t d"], tuple[jax.Array, jax.Array] | None]:
    """x + o_proj(attn(rope(q), rope(k), v)) with pre-RMSNorm, and the updated caches. `kv` = (the whole K
    cache, the whole V cache [layers, b, kv, s, hd], this layer's index): the new keys and values are
    written at `cache_index` in this layer's rows and attention reads the layer's whole cache, as
    `transformer.layer_forward` does."""
    dt = x.dtype
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q = dense(h, p["q_proj"].astype(dt))
    k = dense(h, p["k_proj"].astype(dt))
    v = dense(h, p["v_proj"].astype(dt))
    q = constrain(apply_rope(q, positions, inv_freq), ("batch", "length", "act_heads", None))
    k = constrain(apply_rope(k, positions, inv_freq), ("batch", "length", "act_kv_heads", None))
    new_kv = None
    if kv is None:
        out = attention(q, k, v, mask, cfg.attention)
    else:
        new_kv, k, v = write_kv_cache(kv, k, v, cache_index, dt)
        out = attention(q, k, v, mask, cfg.attention, kv_heads_major=True)
    x = x + dense(out, p["o_proj"].astype(dt), contract=2)
    return constrain(x, ("batch", "length", "act_embed")), new_kv


def dense_mlp(p: dict[str, jax.Array], h: Float[Array, "b t d"]) -> Float[Array, "b t d"]:
    dt = h.dtype
    g = dense(h, p["gate_proj"].astype(dt))
    u = dense(h, p["up_proj"].astype(dt))
    act = constrain(jax.nn.silu(g) * u, ("batch", "length", "act_mlp"))
    return dense(act, p["down_proj"].astype(dt))


class Ocr2TextModel(nnx.Module):
    """`model(input_ids) -> logits [b, t, V]`; `trunk(embeds, ...)` for merged image embeddings."""

    def __init__(self, cfg: Ocr2TextConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        b = cfg.base
        L, d, h, kv, hd, f = b.num_layers, b.hidden_size, b.num_heads, b.num_kv_heads, b.head_dim, b.intermediate_size
        pd = jnp.dtype(b.param_dtype)
        self.embed = param(rngs, (b.vocab_size, d), ("vocab", "embed"), pd)
        attn = {"attn_norm": ((L, d), "ones"), "q_proj": ((L, d, h, hd), "normal"),
                "k_proj": ((L, d, kv, hd), "normal"), "v_proj": ((L, d, kv, hd), "normal"),
                "o_proj": ((L, h, hd, d), "normal"), "mlp_norm": ((L, d), "ones")}
        for name, (shape, init) in attn.items():
            setattr(self, name, param(rngs, shape, LAYER_PARAM_AXES[name], pd, init))
        nd = cfg.count("dense")
        mlp = {"gate_proj": (nd, d, f), "up_proj": (nd, d, f), "down_proj": (nd, f, d)}
        for name, shape in mlp.items():
            setattr(self, name, param(rngs, shape, LAYER_PARAM_AXES[name], pd))
        self.moe = MoeLayers(cfg.moe, cfg.count("sparse"), rngs=rngs)
        self.final_norm = param(rngs, (d,), ("norm",), pd, "ones")
        if not b.tie_embeddings:
            self.lm_head = param(rngs, (d, b.vocab_size), ("embed", "vocab"), pd)

    def embed_tokens(self, input_ids: Int[Array, "b t"]) -> Float[Array, "b t d"]:
        return lookup_rows(self.embed[...], input_ids, jnp.dtype(self.cfg.base.dtype))

    def logits_from_hidden(self, h: Float[Array, "b t d"]) -> Float[Array, "b t v"]:
        w = self.embed[...].T if self.cfg.base.tie_embeddings else self.lm_head[...]
        logits = dense(h, w.astype(h.dtype), out_dtype=jnp.float32)
        return constrain(logits, ("batch", "length", "act_vocab"))

    def trunk(
        self, x: Float[Array, "b t d"], positions: Int[Array, "b t"], mask: Bool[Array, "b t s"]
    ) -> tuple[Float[Array, "b t d"], Float[Array, ""]]:
        """Final-normed hidden states and the mean MoE load-balancing loss over sparse layers."""
        h, aux, _ = self._layers(x, positions, mask)
        return h, aux

    def _layers(
        self, x: Float[Array, "b t d"], positions: Int[Array, "b t"], mask: Bool[Array, "b t s"],
        cache: KVCache | None = None,
    ) -> tuple[Float[Array, "b t d"], Float[Array, ""], KVCache | None]:
        """(final-normed hidden states, mean load-balancing loss, the cache with this block written). With a
        cache, every run of same-type layers scans its layers carrying the whole cache, so each layer
        writes its own rows in place (`attention_block`)."""
        cfg, b = self.cfg, self.cfg.base
        inv_freq = rope_inv_freq(b)
        attn = {n: getattr(self, n)[...] for n in ATTN_NAMES}
        dense = {n: getattr(self, n)[...] for n in DENSE_NAMES}
        moe = self.moe.arrays()
        aux = jnp.zeros((), jnp.float32)
        ck, cv = (None, None) if cache is None else (cache.k, cache.v)
        index = None if cache is None else cache.index
        for kind, start, end, off in cfg.runs:
            mlp_p = dense if kind == "dense" else moe
            xs = ({n: a[start:end] for n, a in attn.items()}, {n: a[off:off + end - start] for n, a in mlp_p.items()},
                  jnp.arange(start, end))

            def body(carry, ps, kind=kind):
                y, acc, ck, cv = carry
                pa, pm, layer = ps
                kv = None if ck is None else (ck, cv, layer)
                y, new_kv = attention_block(b, pa, y, positions, mask, inv_freq, kv, index)
                if new_kv is not None:
                    ck, cv = new_kv
                h = rms_norm(y, pa["mlp_norm"], b.rms_norm_eps)
                if kind == "dense":
                    out, lb = dense_mlp(pm, h), jnp.zeros((), jnp.float32)
                else:
                    out, lb = moe_forward(cfg.moe, pm, h)
                y = constrain(y + out, ("batch", "length", "act_embed"))
                return (y, acc + lb, ck, cv), None

            (x, aux, ck, cv), _ = jax.lax.scan(remat_fn(body, b.remat), (x, aux, ck, cv), xs)
        n_sparse = max(cfg.count("sparse"), 1)
        h = rms_norm(x, self.final_norm[...], b.rms_norm_eps)
        return h, aux / n_sparse, None if cache is None else cache._replace(k=ck, v=cv)

    # -- decoding (the interface `generate.sampler.Sampler` drives, as `Transformer`'s) ------------------
    def init_cache(self, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
        b = self.cfg.base
        shape = (b.num_layers, batch, b.num_kv_heads, max_len, b.head_dim)
        dt = jnp.dtype(dtype or b.dtype)
        return KVCache(k=jnp.zeros(shape, dt), v=jnp.zeros(shape, dt), valid=jnp.zeros((batch, max_len), bool),
                       index=jnp.zeros((), jnp.int32))

    def trunk_cached(
        self, x: Float[Array, "b t d"], positions: Int[Array, "b t"], token_mask: Bool[Array, "b t"], cache: KVCache
    ) -> tuple[Float[Array, "b t d"], KVCache]:
        """A block of T embedded tokens (a prefill, or one decode step) through the cache: slots are shared
        across the batch (prompts left-padded), `token_mask` marks the real ones."""
        t = x.shape[1]
        valid = jax.lax.dynamic_update_slice(cache.valid, token_mask.astype(bool), (0, cache.index))
        slot = jnp.arange(valid.shape[1])[None, None, :]
        mask = (slot <= cache.index + jnp.arange(t)[None, :, None]) & valid[:, None, :]
        h, _, cache = self._layers(x, positions, mask, cache._replace(valid=valid))
        return h, cache._replace(index=cache.index + t)

    def forward_cached(
        self, input_ids: Int[Array, "b t"], positions: Int[Array, "b t"], token_mask: Bool[Array, "b t"],
        cache: KVCache, inputs_embeds: Float[Array, "b t d"] | None = None,
    ) -> tuple[Float[Array, "b t v"], KVCache]:
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        h, cache = self.trunk_cached(x, positions, token_mask, cache)
        return self.logits_from_hidden(h), cache

    def hidden_states(
        self,
        input_ids: Int[Array, "b t"],
        *,
        inputs_embeds: Float[Array, "b t d"] | None = None,
        attention_mask: Int[Array, "b t"] | None = None,
        segment_ids: Int[Array, "b t"] | None = None,
        positions: Int[Array, "b t"] | None = None,
    ) -> tuple[Float[Array, "b t d"], Float[Array, ""]]:
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        segment_ids, positions = default_segments_positions(input_ids.shape, segment_ids, attention_mask, positions)
        return self.trunk(x, positions, causal_mask(segment_ids))

    def __call__(self, input_ids: Int[Array, "b t"], **kw) -> Float[Array, "b t v"]:
        h, _ = self.hidden_states(input_ids, **kw)
        return self.logits_from_hidden(h)
