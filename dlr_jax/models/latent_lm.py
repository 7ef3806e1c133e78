"""A decoder-only backbone plus K latent vocabulary rows built from the VQ codebook (the paper's augmented LM).

Id layout (one softmax over all of it; `dlr_jax.text.tokens.Tokenizer` produces the same layout):

    [0, V_b)                                   text rows: the backbone's own embedding / lm_head
    [V_b, latent_offset)                       gap rows (latent_offset set past the model): masked
    [latent_offset, latent_offset + K)         latent k:  input row P_in(c_k), output row P_out(c_k)
    [latent_offset + K, total_vocab_size)      padding rows (total is a multiple of the tensor axis)

Masked rows get logit `MASKED_LOGIT` (finite, so `p * log p` stays 0 instead of NaN), as do text
rows the tokenizer never produces (`LatentConfig.valid_text_rows`).

P_in and P_out are single linear layers d_c -> d_model (with bias); `tie_projectors` makes P_out
the same module as P_in (the authors' code), so the state holds one copy. No one-hot [B, T, K]
and no P(C) [K, d] table is formed per step: input rows project only the gathered codes, and the
latent logits use h . (c W + b) = (h W^T) . c + h . b, i.e. h is projected down to d_c first
(cheaper whenever d_c < d_model, and for decoding by far).

The backbone is wrapped, not copied: `from_backbone` takes an existing (e.g. HF-imported, sharded)
`Transformer`; its seams `embed_tokens` / `logits_from_hidden` / `trunk` / `trunk_cached` are reused,
so `dlr_jax.generate.sampler.Sampler(latent_lm)` works unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.config import ModelConfig
from dlr_jax.core.sharding import constrain, named_sharding
from dlr_jax.models.attention import OutMajor
from dlr_jax.models.transformer import KVCache, Transformer, dense, out_major_layers

MASKED_LOGIT = -1e9

Runs = tuple[tuple[int, int], ...]


# ----------------------------------------------------------------------------------------------
# Configuration.


def _mask_to_runs(mask: np.ndarray) -> Runs:
    """Bool mask -> ((start, stop), ...) of its True stretches (hashable, compact for real vocabs)."""
    padded = np.concatenate([[False], mask.astype(bool), [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return tuple((int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True))


@functools.lru_cache(maxsize=32)
def _runs_to_mask(runs: Runs, n: int) -> np.ndarray:
    mask = np.zeros(n, bool)
    for a, b in runs:
        mask[a:b] = True
    mask.setflags(write=False)
    return mask


@dataclasses.dataclass(frozen=True)
class LatentConfig:
    """Latent vocabulary of a `LatentLM`.

    valid_text_rows: None (every text row may be predicted), or a bool mask over ids (length
    >= latent_offset is cut to [0, latent_offset); e.g. `Tokenizer.vocab_padding_mask()`), or
    ((start, stop), ...) runs of valid text ids. Stored as runs so the config stays hashable
    (it is static under jit).
    codebook_trainable: whether stage `sft` trains the codebook (`filter_for_stage`).
    """

    num_latents: int
    latent_dim: int
    latent_offset: int
    total_vocab_size: int
    tie_projectors: bool = False
    codebook_trainable: bool = True
    valid_text_rows: Any = None
    codebook_dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("num_latents", "latent_dim", "latent_offset"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"LatentConfig.{name} must be >= 1, got {getattr(self, name)}")
        end = self.latent_offset + self.num_latents
        if self.total_vocab_size < end:
            raise ValueError(
                f"LatentConfig.total_vocab_size={self.total_vocab_size} < latent_offset + num_latents = {end}"
            )
        object.__setattr__(self, "valid_text_rows", self._normalise_rows(self.valid_text_rows))

    def _normalise_rows(self, rows: Any) -> Runs | None:
        if rows is None:
            return None
        arr = np.asarray(rows)
        if arr.ndim == 2 and arr.shape[1] == 2:  # runs
            runs = tuple((int(a), int(b)) for a, b in arr)
            if any(not 0 <= a <= b <= self.latent_offset for a, b in runs):
                raise ValueError(
                    f"valid_text_rows runs {runs} must lie within [0, latent_offset={self.latent_offset}]"
                )
            mask = _runs_to_mask(runs, self.latent_offset)
        elif arr.ndim == 1:
            mask = np.zeros(self.latent_offset, bool)
            n = min(arr.shape[0], self.latent_offset)
            mask[:n] = arr[:n].astype(bool)
        else:
            raise ValueError(
                f"valid_text_rows must be None, a 1-D bool mask or (start, stop) runs; got shape {arr.shape}"
            )
        return _mask_to_runs(mask)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, latent_dim: int, **kwargs: Any) -> LatentConfig:
        """Layout from a `dlr_jax.text.tokens.Tokenizer` (K = its `num_latents`); text rows it never
        produces are masked out of the softmax."""
        if tokenizer.num_latents < 1:
            raise ValueError(
                f"{tokenizer!r} has no latent ids; build it with num_latents=K (or tokenizer.with_latents(K))"
            )
        kwargs.setdefault("valid_text_rows", tokenizer.vocab_padding_mask())
        return cls(
            num_latents=tokenizer.num_latents,
            latent_dim=int(latent_dim),
            latent_offset=tokenizer.latent_offset,
            total_vocab_size=tokenizer.total_vocab_size,
            **kwargs,
        )

    def text_row_mask(self) -> np.ndarray:
        """Bool [latent_offset]: text rows that may be predicted (before the backbone-size cut)."""
        if self.valid_text_rows is None:
            return np.ones(self.latent_offset, bool)
        return _runs_to_mask(self.valid_text_rows, self.latent_offset)


# ----------------------------------------------------------------------------------------------
# Modules.


class LatentProjector(nnx.Module):
    """y = c W + b, W [d_c, d_model]. Init as torch.nn.Linear (U(+-1/sqrt(d_c)) for W and b), as in
    the authors' code."""

    def __init__(self, in_dim: int, out_dim: int, *, param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
        bound = 1.0 / math.sqrt(in_dim)
        init = lambda shape: jax.random.uniform(rngs.params(), shape, jnp.float32, -bound, bound).astype(
            param_dtype
        )
        self.kernel = nnx.Param(init((in_dim, out_dim)), logical_axes=("latent_dim", "embed"))
        self.bias = nnx.Param(init((out_dim,)), logical_axes=("embed",))

    def __call__(self, c: Float[Array, "... c"]) -> Float[Array, "... d"]:
        dt = c.dtype
        return jnp.einsum("...c,cd->...d", c, self.kernel[...].astype(dt)) + self.bias[...].astype(dt)


class LatentLM(nnx.Module):
    """`model(input_ids) -> logits [B, T, total_vocab_size]` (fp32) over text + latent rows.

    backbone: the text LM (its `vocab_size` rows are the text rows; must be <= latent_offset).
    codebook: [K, d_c] initial codebook (e.g. the codebook stage's); random N(0, 1) if None.
    Parameter paths: `backbone/...`, `codebook`, `p_in/{kernel,bias}`, `p_out/{kernel,bias}`
    (no `p_out` entries when tied: it is the `p_in` module).
    """

    def __init__(
        self,
        backbone: Transformer,
        cfg: LatentConfig,
        *,
        codebook: Any = None,
        rngs: nnx.Rngs,
    ):
        vb = backbone.cfg.vocab_size
        if cfg.latent_offset < vb:
            raise ValueError(
                f"latent_offset={cfg.latent_offset} is below the backbone's {vb} embedding rows: latent ids "
                "would alias pretrained rows (size the tokenizer with min_text_vocab_size=model rows)"
            )
        if cfg.valid_text_rows is not None and any(b > vb for _, b in cfg.valid_text_rows):
            first = next(max(a, vb) for a, b in cfg.valid_text_rows if b > vb)
            raise ValueError(
                f"text id {first} may be produced by the tokenizer but the backbone has only {vb} rows; "
                "grow the backbone first (dlr_jax.models.latent_lm.grow_vocab)"
            )
        self.backbone = backbone
        self.latent_cfg = cfg
        k, dc = cfg.num_latents, cfg.latent_dim
        if codebook is None:
            value = jax.random.normal(rngs.params(), (k, dc), jnp.float32).astype(cfg.codebook_dtype)
        else:
            value = jnp.asarray(codebook, cfg.codebook_dtype)
            if value.shape != (k, dc):
                raise ValueError(
                    f"codebook has shape {value.shape}, expected (num_latents, latent_dim) = {(k, dc)}"
                )
        self.codebook = nnx.Param(value, logical_axes=("codes", "latent_dim"))
        pd = jnp.dtype(backbone.cfg.param_dtype)
        self.p_in = LatentProjector(dc, backbone.cfg.hidden_size, param_dtype=pd, rngs=rngs)
        self.p_out = (
            self.p_in if cfg.tie_projectors
            else LatentProjector(dc, backbone.cfg.hidden_size, param_dtype=pd, rngs=rngs)
        )

    @classmethod
    def from_backbone(
        cls,
        backbone: Transformer,
        tokenizer_or_cfg: Any,
        *,
        codebook: Any = None,
        latent_dim: int | None = None,
        rngs: nnx.Rngs,
        mesh: jax.sharding.Mesh | None = None,
        rules: Any = "fsdp",
        **cfg_kwargs: Any,
    ) -> LatentLM:
        """Wraps `backbone` (not copied). With a Tokenizer, `latent_dim` defaults to the codebook's
        width and `cfg_kwargs` go to `LatentConfig.from_tokenizer`. If the backbone is sharded (or
        `mesh` is given) the new params (codebook, projectors) are placed by their logical axes."""
        if isinstance(tokenizer_or_cfg, LatentConfig):
            if latent_dim is not None or cfg_kwargs:
                raise ValueError("latent_dim / config keywords are only used with a Tokenizer")
            cfg = tokenizer_or_cfg
        else:
            if latent_dim is None:
                if codebook is None:
                    raise ValueError("from_backbone with a Tokenizer needs latent_dim= or codebook=")
                latent_dim = int(np.shape(codebook)[-1])
            cfg = LatentConfig.from_tokenizer(tokenizer_or_cfg, latent_dim, **cfg_kwargs)
        model = cls(backbone, cfg, codebook=codebook, rngs=rngs)
        if mesh is None:
            sharding = getattr(backbone.embed.get_value(), "sharding", None)
            if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
                mesh = sharding.mesh
        if mesh is not None:
            model.place_latent_params(mesh, rules)
        return model

    # -- parameters ------------------------------------------------------------------------------
    def place_latent_params(self, mesh: jax.sharding.Mesh, rules: Any = "fsdp") -> None:
        """device_put codebook and projectors onto `mesh` by their logical axes (backbone untouched)."""
        for var in (self.codebook, self.p_in.kernel, self.p_in.bias, self.p_out.kernel, self.p_out.bias):
            value = var.get_value()
            sh = named_sharding(mesh, var.get_metadata()["logical_axes"], value.shape, rules)
            var.set_value(jax.device_put(value, sh))

    def set_codebook(self, codebook: Any) -> None:
        """Replaces the codebook values (e.g. with the codebook stage's); keeps dtype and sharding."""
        cur = self.codebook.get_value()
        value = jnp.asarray(codebook, cur.dtype)
        if value.shape != cur.shape:
            raise ValueError(f"codebook has shape {value.shape}, expected {cur.shape}")
        sharding = getattr(cur, "sharding", None)
        self.codebook.set_value(jax.device_put(value, sharding) if sharding is not None else value)

    @property
    def model_cfg(self) -> ModelConfig:
        return self.backbone.cfg

    @property
    def vocab_size(self) -> int:
        return self.latent_cfg.total_vocab_size

    def vocab_mask(self) -> np.ndarray:
        """Bool [total_vocab_size]: rows that may be predicted (valid text rows + latents)."""
        c, vb = self.latent_cfg, self.backbone.cfg.vocab_size
        mask = np.zeros(c.total_vocab_size, bool)
        mask[:vb] = c.text_row_mask()[:vb]
        mask[c.latent_offset : c.latent_offset + c.num_latents] = True
        return mask

    def is_latent(self, ids: Int[Array, "..."]) -> Bool[Array, "..."]:
        c = self.latent_cfg
        return (ids >= c.latent_offset) & (ids < c.latent_offset + c.num_latents)

    # -- vocabulary seams ------------------------------------------------------------------------
    def embed_latents(self, codes: Int[Array, "b t"]) -> Float[Array, "b t d"]:
        """Input rows P_in(C[k]) for code indices k (not token ids), in the backbone's dtype."""
        table = constrain(self.codebook[...], (None, None))  # small; gathers want it replicated
        rows = jnp.take(table, codes, axis=0, mode="clip").astype(jnp.dtype(self.backbone.cfg.dtype))
        return self.p_in(rows)

    def latent_rows(self, which: str = "in") -> Float[Array, "k d"]:
        """P_in(C) or P_out(C) [K, d_model] (fp32), e.g. for inspection or the OCR branch."""
        proj = self.p_in if which == "in" else self.p_out
        return proj(self.codebook[...].astype(jnp.float32))

    def embed_tokens(self, input_ids: Int[Array, "b t"]) -> Float[Array, "b t d"]:
        """Text ids -> backbone rows, latent ids -> P_in(c_k). Ids in gap/padding rows are clipped to
        the last backbone row (the softmax never produces them)."""
        c = self.latent_cfg
        vb = self.backbone.cfg.vocab_size
        lat = self.is_latent(input_ids)
        text = self.backbone.embed_tokens(jnp.clip(input_ids, 0, vb - 1))
        codes = jnp.clip(input_ids - c.latent_offset, 0, c.num_latents - 1)
        x = jnp.where(lat[..., None], self.embed_latents(codes).astype(text.dtype), text)
        return constrain(x, ("batch", "length", "act_embed"))

    def latent_logits(self, h: Float[Array, "b t d"], out_major: bool = False) -> Float[Array, "b t k"]:
        """h . P_out(C)^T computed as (h W^T) . C^T + h . b (fp32 out). `out_major`: see
        `Transformer.logits_from_hidden` (W and C already are: no copy)."""
        dt = h.dtype
        # on CPU 2-D matmuls over the flattened (b, t) dims: see `attention.dense`.
        w, c = self.p_out.kernel[...].astype(dt), self.codebook[...].astype(dt)
        u = dense(h, OutMajor(w) if out_major else w.T)
        logits = dense(u, OutMajor(c) if out_major else c.T, out_dtype=jnp.float32)
        hb = jnp.einsum("btd,d->bt", h, self.p_out.bias[...].astype(dt), preferred_element_type=jnp.float32)
        return constrain(logits + hb[..., None], ("batch", "length", "act_vocab"))

    def logits_from_hidden(self, h: Float[Array, "b t d"], out_major: bool = False) -> Float[Array, "b t v"]:
        """[text logits (backbone) ; masked gap ; latent logits ; masked padding], fp32. `out_major`:
        see `Transformer.logits_from_hidden`."""
        c, vb = self.latent_cfg, self.backbone.cfg.vocab_size
        text = self.backbone.logits_from_hidden(h, out_major).astype(jnp.float32)
        keep = c.text_row_mask()[:vb]
        if not keep.all():
            text = jnp.where(keep, text, MASKED_LOGIT)
        lead = h.shape[:-1]
        parts = [text]
        if c.latent_offset > vb:
            parts.append(jnp.full((*lead, c.latent_offset - vb), MASKED_LOGIT, jnp.float32))
        parts.append(self.latent_logits(h, out_major))
        pad = c.total_vocab_size - c.latent_offset - c.num_latents
        if pad:
            parts.append(jnp.full((*lead, pad), MASKED_LOGIT, jnp.float32))
        return constrain(jnp.concatenate(parts, axis=-1), ("batch", "length", "act_vocab"))

    # -- forward passes (the backbone's trunk with our vocabulary) --------------------------------
    def trunk(
        self, x: Float[Array, "b t d"], positions: Int[Array, "b t"], mask: Bool[Array, "b t s"],
        cache: KVCache | None = None,
    ) -> tuple[Float[Array, "b t d"], KVCache | None]:
        return self.backbone.trunk(x, positions, mask, cache)

    def hidden_states(
        self,
        input_ids: Int[Array, "b t"],
        *,
        positions: Int[Array, "b t"] | None = None,
        segment_ids: Int[Array, "b t"] | None = None,
        attention_mask: Int[Array, "b t"] | None = None,
        inputs_embeds: Float[Array, "b t d"] | None = None,
    ) -> Float[Array, "b t d"]:
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self.backbone.hidden_states(
            input_ids, positions=positions, segment_ids=segment_ids, attention_mask=attention_mask,
            inputs_embeds=x,
        )

    def __call__(
        self,
        input_ids: Int[Array, "b t"],
        positions: Int[Array, "b t"] | None = None,
        segment_ids: Int[Array, "b t"] | None = None,
        attention_mask: Int[Array, "b t"] | None = None,
    ) -> Float[Array, "b t v"]:
        _check_ids(input_ids, positions, segment_ids, attention_mask)
        return self.logits_from_hidden(
            self.hidden_states(
                input_ids, positions=positions, segment_ids=segment_ids, attention_mask=attention_mask
            )
        )

    def init_cache(self, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
        return self.backbone.init_cache(batch, max_len, dtype)

    def layer_slices(self, out_major: bool = False) -> list[dict[str, Any]]:
        return self.backbone.layer_slices(out_major)

    def trunk_cached(
        self, x: Float[Array, "b t d"], positions: Int[Array, "b t"], token_mask: Bool[Array, "b t"],
        cache: KVCache, layers: Sequence[dict[str, jax.Array]] | None = None,
    ) -> tuple[Float[Array, "b t d"], KVCache]:
        return self.backbone.trunk_cached(x, positions, token_mask, cache, layers)

    def forward_cached(
        self,
        input_ids: Int[Array, "b t"],
        positions: Int[Array, "b t"],
        token_mask: Bool[Array, "b t"],
        cache: KVCache,
        inputs_embeds: Float[Array, "b t d"] | None = None,
        layers: Sequence[dict[str, jax.Array]] | None = None,
    ) -> tuple[Float[Array, "b t v"], KVCache]:
        if inputs_embeds is None:
            _check_ids(input_ids, positions, token_mask)
        else:
            chex.assert_rank(inputs_embeds, 3)
            chex.assert_equal_shape_prefix([inputs_embeds, positions, token_mask], 2)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        h, cache = self.trunk_cached(x, positions, token_mask, cache, layers)
        return self.logits_from_hidden(h, out_major_layers(layers)), cache


def _check_ids(input_ids: Array, *per_token: Array | None) -> None:
    """Trace-time (free at run time): integer ids [b, t], and every per-token array the same [b, t]."""
    chex.assert_rank(input_ids, 2)
    chex.assert_type(input_ids, int)
    chex.assert_equal_shape([input_ids, *(x for x in per_token if x is not None)])


def build_latent_lm(
    model_cfg: ModelConfig,
    latent_cfg: LatentConfig,
    *,
    codebook: Any = None,
    seed: int = 0,
    rngs: nnx.Rngs | None = None,
) -> LatentLM:
    """A fresh backbone + latent rows; use inside `create_sharded(lambda: build_latent_lm(...), mesh)`.
    `rngs` overrides `seed` (e.g. an "rbg" key, much cheaper to compile than threefry)."""
    rngs = nnx.Rngs(params=seed) if rngs is None else rngs
    return LatentLM(Transformer(model_cfg, rngs=rngs), latent_cfg, codebook=codebook, rngs=rngs)


# ----------------------------------------------------------------------------------------------
# Trainable-parameter filters per stage.

PROJECTORS = nnx.All(nnx.Param, nnx.Any(nnx.PathContains("p_in"), nnx.PathContains("p_out")))
CODEBOOK = nnx.All(nnx.Param, nnx.PathContains("codebook"))
BACKBONE = nnx.All(nnx.Param, nnx.PathContains("backbone"))
STAGES = ("textsft", "align", "sft", "rl")


def filter_for_stage(stage: str, cfg: LatentConfig | None = None) -> Any:
    """The params a stage trains (an nnx filter; `nnx.Not(f)` is the frozen rest).

    align: projectors; sft: backbone + projectors (+ codebook if `cfg.codebook_trainable`, the
    default); rl: backbone + projectors; textsft (text-CoT baseline, same model): backbone.
    """
    if stage == "align":
        return PROJECTORS
    if stage == "sft":
        train_codebook = True if cfg is None else cfg.codebook_trainable
        return nnx.Any(BACKBONE, PROJECTORS, CODEBOOK) if train_codebook else nnx.Any(BACKBONE, PROJECTORS)
    if stage == "rl":
        return nnx.Any(BACKBONE, PROJECTORS)
    if stage == "textsft":
        return BACKBONE
    raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")


# ----------------------------------------------------------------------------------------------
# Growing a pretrained backbone's vocabulary (e.g. boundary tokens added to a Llama tokenizer).


def grow_vocab(backbone: Transformer, vocab_size: int, rules: Any = "fsdp") -> Transformer:
    """Appends rows to the backbone's embedding (and lm_head) in place, each new row the mean of
    the existing ones (a neutral start for added tokens); shardings follow the logical axes.
    Old rows, and so logits of old ids over old rows, are unchanged. Returns `backbone`."""
    old = backbone.cfg.vocab_size
    if vocab_size < old:
        raise ValueError(f"grow_vocab cannot shrink the vocabulary ({old} -> {vocab_size})")
    if vocab_size == old:
        return backbone
    extra = vocab_size - old

    def grow(var: nnx.Param, axis: int) -> None:
        value = var.get_value()
        def fn(w: jax.Array) -> jax.Array:
            mean = jnp.mean(w.astype(jnp.float32), axis, keepdims=True).astype(w.dtype)
            return jnp.concatenate([w, jnp.repeat(mean, extra, axis)], axis)

        sharding = getattr(value, "sharding", None)
        if isinstance(sharding, NamedSharding):
            shape = list(value.shape)
            shape[axis] = vocab_size
            out = named_sharding(sharding.mesh, var.get_metadata()["logical_axes"], shape, rules)
            var.set_value(jax.jit(fn, out_shardings=out)(value))
        else:
            var.set_value(fn(value))

    grow(backbone.embed, 0)
    if not backbone.cfg.tie_embeddings:
        grow(backbone.lm_head, 1)
    backbone.cfg = dataclasses.replace(backbone.cfg, vocab_size=vocab_size)
    return backbone


__all__ = [
    "BACKBONE", "CODEBOOK", "MASKED_LOGIT", "PROJECTORS", "STAGES", "LatentConfig", "LatentLM",
    "LatentProjector", "build_latent_lm", "filter_for_stage", "grow_vocab",
]
