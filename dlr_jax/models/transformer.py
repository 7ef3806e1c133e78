"""Decoder-only transformer: Llama-3.x, Qwen2, Qwen3 and the Qwen3-VL text tower.

Parameters live in NNX `Param`s with logical axis names; layer weights are stacked along a
leading `layers` dim and the forward pass is a `lax.scan` over them, so compile time does not grow
with depth (a decode loop instead runs the layers one after another on per-layer buffers, and so does a
shallow model compiled for CPU: `run_layers`, `model.scan_layers`).
All maths is written as pure functions over arrays; the module only owns parameters. Attention, the
projections (`dense`) and the masks are in models/attention.py.

Seams for the latent vocabulary (dlr_jax/models/latent_lm.py): `embed_tokens` and
`logits_from_hidden` are the only places the vocabulary is touched, and `trunk` takes embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.config import ModelConfig
from dlr_jax.core.sharding import constrain
from dlr_jax.models.attention import (
    NEG_INF,
    OutMajor,
    attention,
    causal_mask,
    dense,
    resolve_attention,
    target_platform,
)
from dlr_jax.models.embedding import lookup_rows
from dlr_jax.models.rope import apply_rope, rope_inv_freq


class KVCache(NamedTuple):
    """Decoding state. `index` is the next slot to write; slots are shared across the batch
    (prompts are left-padded), `valid` marks which slots hold real tokens per row. `k`, `v`: one
    stacked array, or (`unstack_cache`) a tuple of one [b, kv, s, hd] buffer per layer, which a decode
    loop over per-layer weights (`Transformer.layer_slices`) updates and reads in place."""

    k: Float[Array, "layers b kv s hd"] | tuple[Float[Array, "b kv s hd"], ...]  # KV heads before slots:
    v: Float[Array, "layers b kv s hd"] | tuple[Float[Array, "b kv s hd"], ...]  # what attention reads
    valid: Bool[Array, "b s"]
    index: Int[Array, ""]


# The projection matrices of a decoder layer and how many leading (input) dims each contracts.
PROJ_IN_DIMS: dict[str, int] = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1,
                                "up_proj": 1, "down_proj": 1}


def out_major_layers(layers: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether `layers` (`layer_slices`) hold `OutMajor` projections."""
    return bool(layers) and isinstance(layers[0].get("q_proj"), OutMajor)


def unstack_cache(cache: KVCache) -> KVCache:
    """The cache with one K and one V buffer per layer (a copy; on a fresh all-zero cache XLA only
    allocates the buffers)."""
    if isinstance(cache.k, tuple):
        return cache
    n = cache.k.shape[0]
    return cache._replace(k=tuple(cache.k[i] for i in range(n)), v=tuple(cache.v[i] for i in range(n)))


def _dtype(name: str) -> jnp.dtype:
    return jnp.dtype(name)


# ----------------------------------------------------------------------------------------------
# Pure building blocks.


__all__ = ["NEG_INF", "DecoderLayers", "KVCache", "Transformer", "attention", "build_model", "causal_mask",
           "default_segments_positions", "dense", "layer_forward", "loops_layers", "out_major_layers", "param_count",
           "resolve_attention", "rms_norm", "run_layers", "segment_positions", "split_layers", "target_platform",
           "unstack_cache"]


def rms_norm(x: Float[Array, "... d"], weight: Float[Array, " d"], eps: float) -> Float[Array, "... d"]:
    # Statistics in fp32 whatever the activation dtype (as HF does), weight applied after cast back.
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * y.astype(x.dtype)


LAYER_PARAM_AXES: dict[str, tuple[str, ...]] = {
    "attn_norm": ("layers", "norm"),
    "q_proj": ("layers", "embed", "q_heads", "head_dim"),
    "k_proj": ("layers", "embed", "kv_heads", "head_dim"),
    "v_proj": ("layers", "embed", "kv_heads", "head_dim"),
    "o_proj": ("layers", "q_heads", "head_dim", "embed"),
    "q_bias": ("layers", "q_heads", "head_dim"),
    "k_bias": ("layers", "kv_heads", "head_dim"),
    "v_bias": ("layers", "kv_heads", "head_dim"),
    "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"),
    "mlp_norm": ("layers", "norm"),
    "gate_proj": ("layers", "embed", "mlp"),
    "up_proj": ("layers", "embed", "mlp"),
    "down_proj": ("layers", "mlp", "embed"),
}


def layer_forward(
    cfg: ModelConfig,
    p: dict[str, jax.Array],
    x: Float[Array, "b t d"],
    positions: Int[Array, "b t"],
    mask: Bool[Array, "b t s"],
    inv_freq: jax.Array,
    kv: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    cache_index: jax.Array | None = None,
    segment_ids: Int[Array, "b t"] | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """One pre-norm decoder layer. With `kv` = (the whole K cache, the whole V cache [layers, b, kv, s,
    hd], this layer's index) the new keys and values are written at `cache_index` in this layer's
    rows, attention reads the layer's whole cache, and the updated caches are returned. With `kv` =
    (this layer's K buffer, its V buffer [b, kv, s, hd], None) the same happens in those buffers.
    `segment_ids`: see `attention`."""
    dt = x.dtype
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q = dense(h, p["q_proj"].astype(dt))
    k = dense(h, p["k_proj"].astype(dt))
    v = dense(h, p["v_proj"].astype(dt))
    if cfg.attention_bias:
        q, k, v = q + p["q_bias"].astype(dt), k + p["k_bias"].astype(dt), v + p["v_bias"].astype(dt)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q = constrain(apply_rope(q, positions, inv_freq), ("batch", "length", "act_heads", None))
    k = constrain(apply_rope(k, positions, inv_freq), ("batch", "length", "act_kv_heads", None))
    new_kv = None
    if kv is not None:
        # The new tokens go straight into the whole cache [layers, b, kv, s, hd] (an in-place write
        # of T slots), then attention reads this layer's slice. Slicing the layer out first, updating
        # the slice and writing it back made XLA:CPU copy each layer's cache several times per step.
        new_kv, k, v = write_kv_cache(kv, k, v, cache_index, dt)
        attn = attention(q, k, v, mask, cfg.attention, kv_heads_major=True)
    else:
        attn = attention(q, k, v, mask, cfg.attention, segment_ids)
    x = x + dense(attn, p["o_proj"].astype(dt), contract=2)
    x = constrain(x, ("batch", "length", "act_embed"))
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    gate = dense(h, p["gate_proj"].astype(dt))
    up = dense(h, p["up_proj"].astype(dt))
    act = constrain(jax.nn.silu(gate) * up, ("batch", "length", "act_mlp"))
    x = x + dense(act, p["down_proj"].astype(dt))
    return constrain(x, ("batch", "length", "act_embed")), new_kv


def remat_fn(fn, policy: str):
    if policy == "none":
        return fn
    if policy == "full":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


LOOP_MAX_LAYERS = 8  # `scan_layers: auto` loops over at most this many layers on CPU


def loops_layers(cfg: ModelConfig, n_layers: int) -> bool:
    """Whether a forward without a cache runs the layers one after another (`model.scan_layers`)."""
    if cfg.scan_layers != "auto":
        return cfg.scan_layers == "loop"
    return n_layers <= LOOP_MAX_LAYERS and target_platform() == "cpu"


def split_layers(stacked: Any, n_layers: int) -> list[Any]:
    """The stacked [layers, ...] weight tree as one tree per layer. `lax.split`, not n slices: its
    gradient is one concatenate, where a slice's is a zero-padded full-size buffer per layer."""
    leaves, tree = jax.tree.flatten(stacked)
    pieces = [jax.lax.split(a, [1] * n_layers) for a in leaves]
    return [tree.unflatten([p[i][0] for p in pieces]) for i in range(n_layers)]


def run_layers(
    cfg: ModelConfig,
    layer_params: dict[str, jax.Array] | Sequence[dict[str, jax.Array]],
    x: Float[Array, "b t d"],
    positions: Int[Array, "b t"],
    mask: Bool[Array, "b t s"],
    cache: KVCache | None = None,
    segment_ids: Int[Array, "b t"] | None = None,
) -> tuple[Float[Array, "b t d"], KVCache | None]:
    """Scans `layer_forward` over the stacked layer params (and the cache, carried in place).
    `segment_ids` (no cache): `mask` is `causal_mask(segment_ids)`, which lets TPU use splash.
    `layer_params` may instead be one dict per layer (`Transformer.layer_slices`, with a cache): the
    layers then run one after another in the program, each reading its own weight buffers and its own
    cache buffers (the cache comes back unstacked: `unstack_cache`)."""
    inv_freq = rope_inv_freq(cfg)
    if not isinstance(layer_params, Mapping):
        if cache is None:
            raise ValueError("per-layer weights are for cached decoding; a forward without a cache scans")
        # A scan slices each layer's weights out of the stacked arrays, and XLA:CPU copies every slice,
        # every step: in a decode loop that is the whole model's weights copied per token. Buffers
        # sliced once before the loop (`layer_slices`) are read where they lie.
        # Reading one layer out of a stacked cache is a slice XLA:CPU copies, every step: the layers
        # work on their own cache buffers instead.
        cache = unstack_cache(cache)
        ks, vs = list(cache.k), list(cache.v)
        for i, p in enumerate(layer_params):
            x, (ks[i], vs[i]) = layer_forward(cfg, p, x, positions, mask, inv_freq, (ks[i], vs[i], None),
                                              cache.index)
        return x, cache._replace(k=tuple(ks), v=tuple(vs))

    if cache is None:

        def body(carry, p):
            y, _ = layer_forward(cfg, p, carry, positions, mask, inv_freq, segment_ids=segment_ids)
            return y, None

        n_layers = jax.tree.leaves(layer_params)[0].shape[0]
        if loops_layers(cfg, n_layers):
            # The scan's backward needs each layer's residuals stacked [layers, ...], and XLA:CPU
            # zero-fills those buffers every step before writing them (`wrapped_broadcast`); a loop keeps
            # them as separate arrays, and SFT gradients of 2-8 layers run faster (BENCHMARKS.md, section
            # "SFT train step"); the codebook's ViT, 3 blocks in models/vision.py, gained nothing: it keeps its scan.
            layer = remat_fn(body, cfg.remat)
            for p in split_layers(layer_params, n_layers):
                x, _ = layer(x, p)
            return x, None
        x, _ = jax.lax.scan(remat_fn(body, cfg.remat), x, layer_params)
        return x, None

    # The full cache is carried (not emitted as scan outputs) so each layer updates its slice in
    # place instead of the scan materialising a second copy of the cache.
    def body_cached(carry, xs):
        y, ck, cv = carry
        p, i = xs
        y, (ck, cv) = layer_forward(cfg, p, y, positions, mask, inv_freq, (ck, cv, i), cache.index)
        return (y, ck, cv), None

    if isinstance(cache.k, tuple):
        raise ValueError("a cache of per-layer buffers (unstack_cache) needs per-layer weights: pass "
                         "layers=model.layer_slices()")
    n_layers = cache.k.shape[0]
    (x, ck, cv), _ = jax.lax.scan(
        remat_fn(body_cached, cfg.remat), (x, cache.k, cache.v), (layer_params, jnp.arange(n_layers))
    )
    return x, cache._replace(k=ck, v=cv)


# ----------------------------------------------------------------------------------------------
# Parameter containers.


def write_kv_cache(kv, k: Array, v: Array, cache_index, dt) -> tuple[tuple[Array, Array], Array, Array]:
    """Writes a layer's new keys / values `[b, T, kv, hd]` at `cache_index` and returns `((ck, cv), k, v)`, the
    updated caches and this layer's whole cache `[b, kv, s, hd]` to attend over. `kv = (ck, cv, layer)`: the
    stacked caches `[layers, b, kv, s, hd]` and this layer's index, or `layer=None` for a layer's own buffers
    `[b, kv, s, hd]` (`unstack_cache`)."""
    ck, cv, layer = kv
    if layer is None:  # no slicing at all
        at = (0, 0, cache_index, 0)
        ck = jax.lax.dynamic_update_slice(ck, k.swapaxes(1, 2).astype(ck.dtype), at)
        cv = jax.lax.dynamic_update_slice(cv, v.swapaxes(1, 2).astype(cv.dtype), at)
        return (ck, cv), ck.astype(dt), cv.astype(dt)
    at = (layer, 0, 0, cache_index, 0)
    ck = jax.lax.dynamic_update_slice(ck, k.swapaxes(1, 2).astype(ck.dtype)[None], at)
    cv = jax.lax.dynamic_update_slice(cv, v.swapaxes(1, 2).astype(cv.dtype)[None], at)
    k = jax.lax.dynamic_index_in_dim(ck, layer, keepdims=False).astype(dt)
    v = jax.lax.dynamic_index_in_dim(cv, layer, keepdims=False).astype(dt)
    return (ck, cv), k, v


def new_param(rngs: nnx.Rngs, shape, axes, dtype, init: str = "normal", scale: float = 0.02) -> nnx.Param:
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        value = (scale * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, logical_axes=tuple(axes))


class DecoderLayers(nnx.Module):
    """All decoder layers, each weight stacked along a leading `layers` dim."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        L, d, h, kv, hd, f = (
            cfg.num_layers,
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
        )
        pd = _dtype(cfg.param_dtype)
        shapes = {
            "attn_norm": ((L, d), "ones"),
            "q_proj": ((L, d, h, hd), "normal"),
            "k_proj": ((L, d, kv, hd), "normal"),
            "v_proj": ((L, d, kv, hd), "normal"),
            "o_proj": ((L, h, hd, d), "normal"),
            "mlp_norm": ((L, d), "ones"),
            "gate_proj": ((L, d, f), "normal"),
            "up_proj": ((L, d, f), "normal"),
            "down_proj": ((L, f, d), "normal"),
        }
        if cfg.attention_bias:
            shapes |= {
                "q_bias": ((L, h, hd), "zeros"),
                "k_bias": ((L, kv, hd), "zeros"),
                "v_bias": ((L, kv, hd), "zeros"),
            }
        if cfg.qk_norm:
            shapes |= {"q_norm": ((L, hd), "ones"), "k_norm": ((L, hd), "ones")}
        self.names = tuple(shapes)
        for name, (shape, init) in shapes.items():
            setattr(self, name, new_param(rngs, shape, LAYER_PARAM_AXES[name], pd, init))

    def arrays(self) -> dict[str, jax.Array]:
        return {n: getattr(self, n)[...] for n in self.names}


class Transformer(nnx.Module):
    """`model(input_ids) -> logits [B, T, V]` (fp32 logits)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        pd = _dtype(cfg.param_dtype)
        self.embed = new_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        self.layers = DecoderLayers(cfg, rngs=rngs)
        self.final_norm = new_param(rngs, (cfg.hidden_size,), ("norm",), pd, "ones")
        if not cfg.tie_embeddings:
            self.lm_head = new_param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

    # -- vocabulary seams ------------------------------------------------------------------------
    def embed_tokens(self, input_ids: Int[Array, "b t"]) -> Float[Array, "b t d"]:
        # Only the looked-up rows are cast; `lookup_rows` says when a table's vocab dim is gathered.
        return lookup_rows(self.embed[...], input_ids, _dtype(self.cfg.dtype))

    def logits_from_hidden(self, h: Float[Array, "b t d"], out_major: bool = False) -> Float[Array, "b t v"]:
        """`out_major`: multiply the head as an `OutMajor` weight (CPU decode steps, see `layer_slices`):
        the tied embedding already is one; an untied head is transposed, which XLA hoists out of a
        decode loop (once per call)."""
        if out_major:
            w = OutMajor(self.embed[...]) if self.cfg.tie_embeddings else OutMajor.of(self.lm_head[...])
        else:
            w = self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]
        logits = dense(h, w.astype(h.dtype), out_dtype=jnp.float32)
        return constrain(logits, ("batch", "length", "act_vocab"))

    # -- trunk -----------------------------------------------------------------------------------
    def trunk(
        self,
        x: Float[Array, "b t d"],
        positions: Int[Array, "b t"],
        mask: Bool[Array, "b t s"],
        cache: KVCache | None = None,
        segment_ids: Int[Array, "b t"] | None = None,
        layers: Sequence[dict[str, jax.Array]] | None = None,
    ) -> tuple[Float[Array, "b t d"], KVCache | None]:
        """`layers`: `layer_slices()` taken once outside a decode loop (see `run_layers`)."""
        params = self.layers.arrays() if layers is None else layers
        h, cache = run_layers(self.cfg, params, x, positions, mask, cache, segment_ids)
        return rms_norm(h, self.final_norm[...], self.cfg.rms_norm_eps), cache

    def __call__(
        self,
        input_ids: Int[Array, "b t"],
        *,
        positions: Int[Array, "b t"] | None = None,
        segment_ids: Int[Array, "b t"] | None = None,
        attention_mask: Int[Array, "b t"] | None = None,
    ) -> Float[Array, "b t v"]:
        return self.logits_from_hidden(
            self.hidden_states(
                input_ids, positions=positions, segment_ids=segment_ids, attention_mask=attention_mask
            )
        )

    def hidden_states(
        self,
        input_ids: Int[Array, "b t"],
        *,
        positions: Int[Array, "b t"] | None = None,
        segment_ids: Int[Array, "b t"] | None = None,
        attention_mask: Int[Array, "b t"] | None = None,
        inputs_embeds: Float[Array, "b t d"] | None = None,
    ) -> Float[Array, "b t d"]:
        """Final-normed hidden states. `segment_ids` packs sequences (0 = padding);
        `attention_mask` (1 = real) is the unpacked special case."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        segment_ids, positions = default_segments_positions(
            input_ids.shape, segment_ids, attention_mask, positions
        )
        h, _ = self.trunk(x, positions, causal_mask(segment_ids), segment_ids=segment_ids)
        return h

    # -- decoding --------------------------------------------------------------------------------
    def layer_slices(self, out_major: bool = False) -> list[dict[str, Any]]:
        """Each layer's weights as its own arrays (static slices of the stacked ones: one copy of the
        weights). Taken once before a decode loop and passed as `layers=`, they spare the loop the
        per-token weight copies a scan over stacked layers costs on XLA:CPU.
        `out_major`: the projection matrices as `OutMajor` weights (the layout XLA:CPU streams fastest
        for a few rows; a prefill's many rows gain nothing from it), and `forward_cached` then
        multiplies the head the same way."""
        stacked = self.layers.arrays()
        layers = [{n: a[i] for n, a in stacked.items()} for i in range(self.cfg.num_layers)]
        if out_major:
            layers = [{n: OutMajor.of(a, PROJ_IN_DIMS[n]) if n in PROJ_IN_DIMS else a for n, a in p.items()}
                      for p in layers]
        return layers

    def init_cache(self, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
        cfg = self.cfg
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        dt = _dtype(dtype or cfg.dtype)
        return KVCache(
            k=jnp.zeros(shape, dt),
            v=jnp.zeros(shape, dt),
            valid=jnp.zeros((batch, max_len), bool),
            index=jnp.zeros((), jnp.int32),
        )

    def forward_cached(
        self,
        input_ids: Int[Array, "b t"],
        positions: Int[Array, "b t"],
        token_mask: Bool[Array, "b t"],
        cache: KVCache,
        inputs_embeds: Float[Array, "b t d"] | None = None,
        layers: Sequence[dict[str, jax.Array]] | None = None,
    ) -> tuple[Float[Array, "b t v"], KVCache]:
        """Runs a block of T tokens (a prefill or one decode step) through the cache. `layers`: see
        `layer_slices`."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        h, cache = self.trunk_cached(x, positions, token_mask, cache, layers)
        return self.logits_from_hidden(h, out_major=out_major_layers(layers)), cache

    def trunk_cached(
        self,
        x: Float[Array, "b t d"],
        positions: Int[Array, "b t"],
        token_mask: Bool[Array, "b t"],
        cache: KVCache,
        layers: Sequence[dict[str, jax.Array]] | None = None,
    ) -> tuple[Float[Array, "b t d"], KVCache]:
        t = x.shape[1]
        valid = jax.lax.dynamic_update_slice(cache.valid, token_mask.astype(bool), (0, cache.index))
        s = valid.shape[1]
        slot = jnp.arange(s)[None, None, :]
        query_slot = cache.index + jnp.arange(t)[None, :, None]
        mask = (slot <= query_slot) & valid[:, None, :]
        h, cache = self.trunk(x, positions, mask, cache._replace(valid=valid), layers=layers)
        return h, cache._replace(index=cache.index + t)


def default_segments_positions(
    shape: tuple[int, int],
    segment_ids: jax.Array | None,
    attention_mask: jax.Array | None,
    positions: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """Fills in segment ids (1 = real, 0 = pad) and positions (restart at 0 per segment)."""
    b, t = shape
    if segment_ids is None:
        segment_ids = (
            jnp.ones((b, t), jnp.int32) if attention_mask is None else attention_mask.astype(jnp.int32)
        )
    if positions is None:
        positions = segment_positions(segment_ids)
    return segment_ids, positions


def segment_positions(segment_ids: Int[Array, "b t"]) -> Int[Array, "b t"]:
    """Position of each token within its segment (left padding gets position 0)."""
    t = segment_ids.shape[1]
    idx = jnp.broadcast_to(jnp.arange(t), segment_ids.shape)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return jnp.where(segment_ids != 0, idx - start_idx, 0)


def build_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return Transformer(cfg, rngs=nnx.Rngs(params=seed))


def param_count(model: Any) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
