"""The paper's codebook-construction network as one NNX module, and greedy OCR decoding.

    image [b, L, L] uint8 --Encoder (SAM ViT, neck, 16x compressor, causal flow)--> H [b, N, d_c]
      --VectorQuantizer (nearest code; noise while training; straight-through)--> H_st [b, N, d_c]
      --prefix projection P: d_c -> d_dec--> [P(H_st) ; <bos> c_1 .. c_T] --dense decoder LM--> chars

N = (L / 64)^2 and every N up to the query pool size runs (the pool is truncated to N rows).

Text side: the OCR decoder reads and writes characters (`dlr_jax.text.ocr_text`: why characters, and
the targets as the renderer lays the text out).

`greedy_decode` is the jitted reconstruction: prefill the prefix and <bos> through the KV cache,
then a `lax.while_loop` of one-token steps that stops when every row has emitted <eos> or reached
its own length cap (callers pass 2x the reference length when they know it: repetition loops would
otherwise make the CER meaningless).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.config import Config, ConfigError, ModelConfig, from_dict, to_dict
from dlr_jax.core.sharding import host_value
from dlr_jax.models.causal_flow import CausalFlowConfig, Encoder, EncoderConfig
from dlr_jax.models.qwen3_vl_encoder import Qwen3VLEncoder, Qwen3VLEncoderConfig
from dlr_jax.models.qwen3_vl_vision import Qwen3VLVisionConfig, config_from_hf
from dlr_jax.models.transformer import Transformer, causal_mask, new_param, segment_positions
from dlr_jax.models.vision import VisionConfig, normalize_images
from dlr_jax.models.vq import VectorQuantizer, nearest_codes
from dlr_jax.text.ocr_text import VOCAB
from dlr_jax.text.render import PATCH

# ----------------------------------------------------------------------------------------------
# Configuration.


@dataclasses.dataclass(frozen=True)
class CodebookModelConfig:
    """Everything needed to rebuild the network (stored in the stage's meta.json)."""

    encoder: EncoderConfig | Qwen3VLEncoderConfig  # codebook.encoder: deepencoder | qwen3_vl
    decoder: ModelConfig
    num_codes: int
    sigma: float = 0.0
    max_text_len: int = 512

    @property
    def code_dim(self) -> int:
        return self.encoder.out_dim

    @property
    def num_queries(self) -> int:
        return self.encoder.num_queries

    @staticmethod
    def from_config(cfg: Config) -> CodebookModelConfig:
        """From the `codebook` and `latent` sections (K = latent.num_latents, d_c = latent.latent_dim; the
        causal flow is codebook.flow_hidden wide, 0 = d_c, with a linear map to d_c when they differ)."""
        c, d = cfg.codebook, cfg.latent.latent_dim
        fh = c.flow_hidden or d
        g = c.vit_global_every
        if g < 1 or c.vit_layers % g:
            raise ConfigError(
                f"codebook.vit_global_every={g} must be >= 1 and divide codebook.vit_layers={c.vit_layers}"
            )
        max_n = (c.max_side // PATCH) ** 2
        if max_n > c.num_queries:
            raise ConfigError(
                f"codebook.max_side={c.max_side} renders up to N={max_n} visual tokens but the query pool "
                f"holds codebook.num_queries={c.num_queries}"
            )
        if c.max_text_len < 2:
            raise ConfigError(f"codebook.max_text_len={c.max_text_len} must be >= 2 (a char and <eos>)")
        common = dict(dtype=c.dtype, param_dtype=c.param_dtype, remat=c.remat)
        vision = VisionConfig(
            image_size=c.image_size, hidden_size=c.vit_hidden, num_layers=c.vit_layers, num_heads=c.vit_heads,
            mlp_dim=c.vit_mlp, global_attn_indexes=tuple(range(g - 1, c.vit_layers, g)),
            window_size=c.vit_window, neck_channels=c.neck_channels, compressor_channels=(c.compressor_mid, fh),
            **common,
        )
        flow = CausalFlowConfig(
            hidden_size=fh, intermediate_size=c.flow_mlp, num_layers=c.flow_layers, num_heads=c.flow_heads,
            num_kv_heads=c.flow_kv_heads, head_dim=c.flow_head_dim, num_queries=c.num_queries,
            visual_skip=c.flow_visual_skip, **common,
        )
        decoder = ModelConfig(
            model_type="llama", vocab_size=VOCAB.padded_size(), hidden_size=c.dec_hidden,
            intermediate_size=c.dec_mlp, num_layers=c.dec_layers, num_heads=c.dec_heads,
            num_kv_heads=c.dec_kv_heads, head_dim=c.dec_head_dim, tie_embeddings=True,
            max_position_embeddings=c.num_queries + 2 * c.max_text_len + 1,
            bos_token_id=VOCAB.BOS, eos_token_id=VOCAB.EOS, pad_token_id=VOCAB.PAD, **common,
        )
        encoder = (qwen3_vl_encoder_config(cfg) if c.encoder == "qwen3_vl"
                   else EncoderConfig(vision, flow, code_dim=0 if fh == d else d))
        return CodebookModelConfig(encoder, decoder, cfg.latent.num_latents, c.sigma, c.max_text_len)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> CodebookModelConfig:
        enc = d["encoder"]
        if "tower" in enc:
            encoder = Qwen3VLEncoderConfig(from_dict(Qwen3VLVisionConfig, enc["tower"]), int(enc["code_dim"]),
                                           int(enc["num_queries"]))
        else:
            encoder = EncoderConfig(from_dict(VisionConfig, enc["vision"]), from_dict(CausalFlowConfig, enc["flow"]),
                                    code_dim=int(enc.get("code_dim", 0)))
        return CodebookModelConfig(
            encoder,
            from_dict(ModelConfig, d["decoder"]),
            int(d["num_codes"]),
            float(d.get("sigma", 0.0)),
            int(d.get("max_text_len", 512)),
        )


def qwen3_vl_encoder_config(cfg: Config) -> Qwen3VLEncoderConfig:
    """codebook.encoder=qwen3_vl: the tower of codebook.encoder_from's config.json, or from scratch one sized by
    vit_hidden / vit_layers / vit_heads / vit_mlp with Qwen3-VL's patch 16, 2 x 2 merge and an
    (image_size / 16)^2 position table whose merger writes d_c."""
    import json
    from pathlib import Path

    c = cfg.codebook
    common = dict(dtype=c.dtype, param_dtype=c.param_dtype, remat=c.remat)
    if c.encoder_from:
        f = Path(c.encoder_from) / "config.json"
        try:
            raw = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"codebook.encoder_from: {f}: cannot read a config.json: {e}") from None
        if raw.get("model_type") != "qwen3_vl" or not isinstance(raw.get("vision_config"), Mapping):
            raise ConfigError(f"codebook.encoder_from: {f}: not a qwen3_vl config with a vision_config "
                              f"(model_type {raw.get('model_type')!r})")
        tower = config_from_hf(raw["vision_config"], **common)
    else:
        tower = Qwen3VLVisionConfig(
            depth=c.vit_layers, hidden_size=c.vit_hidden, intermediate_size=c.vit_mlp, num_heads=c.vit_heads,
            out_hidden_size=cfg.latent.latent_dim, num_position_embeddings=(c.image_size // 16) ** 2, **common,
        )
    return Qwen3VLEncoderConfig(tower, cfg.latent.latent_dim, c.num_queries)


# ----------------------------------------------------------------------------------------------
# The module.


class CodebookModel(nnx.Module):
    """Encoder -> VQ -> OCR decoder. Pure functions of arrays; the trainer calls them under jit."""

    def __init__(self, cfg: CodebookModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        if isinstance(cfg.encoder, Qwen3VLEncoderConfig):
            self.encoder = Qwen3VLEncoder(cfg.encoder, rngs=rngs)
        else:
            self.encoder = Encoder(cfg.encoder, rngs=rngs)
        self.vq = VectorQuantizer(cfg.num_codes, cfg.code_dim, sigma=cfg.sigma, rngs=rngs)
        pd = jnp.dtype(cfg.decoder.param_dtype)
        scale = 1.0 / np.sqrt(cfg.code_dim)
        self.prefix_proj = new_param(rngs, (cfg.code_dim, cfg.decoder.hidden_size), ("latent_dim", "embed"), pd,
                                  scale=scale)
        self.decoder = Transformer(cfg.decoder, rngs=rngs)

    # -- encoder side ----------------------------------------------------------------------------
    def encode(self, images: Array) -> Float[Array, "b n dc"]:
        """uint8 images [b, L, L] (grey) or [b, L, L, 3] -> continuous features H [b, (L/64)^2, d_c]."""
        # trace-time checks (free at run time): a float image in 0..255 or a non-square canvas would
        # otherwise come out as silently wrong features
        chex.assert_rank(images, {3, 4})
        chex.assert_type(images, jnp.uint8)
        chex.assert_axis_dimension(images, 2, images.shape[1])
        if images.ndim == 3:
            images = jnp.repeat(images[..., None], 3, axis=-1)
        return self.encoder(normalize_images(images))

    def codes_to_features(self, ids: Int[Array, "b n"]) -> Float[Array, "b n dc"]:
        return jnp.take(self.vq.codebook[...], ids, axis=0)

    def nearest(self, h: Float[Array, "b n dc"]) -> Int[Array, "b n"]:
        """Plain nearest code ids (no noise): what export writes."""
        return nearest_codes(h, self.vq.codebook[...])

    # -- decoder side ----------------------------------------------------------------------------
    def project(self, feats: Float[Array, "b n dc"]) -> Float[Array, "b n d"]:
        dt = jnp.dtype(self.cfg.decoder.dtype)
        return jnp.einsum("bnc,cd->bnd", feats.astype(dt), self.prefix_proj[...].astype(dt))

    def decoder_logits(
        self, feats: Float[Array, "b n dc"], inputs: Int[Array, "b t"], input_mask: Bool[Array, "b t"]
    ) -> Float[Array, "b t v"]:
        """Teacher-forced logits over the text positions: input [P(feats) ; inputs] where `inputs` is
        <bos> followed by the (possibly dropped-out) target chars shifted right; logits[:, j]
        predicts target j. Padding must be at the right end of `inputs`."""
        b, n = feats.shape[:2]
        dec = self.decoder
        x = jnp.concatenate([self.project(feats), dec.embed_tokens(inputs)], axis=1)
        seg = jnp.concatenate([jnp.ones((b, n), jnp.int32), input_mask.astype(jnp.int32)], axis=1)
        h, _ = dec.trunk(x, segment_positions(seg), causal_mask(seg))
        return dec.logits_from_hidden(h[:, n:])


def init_rngs(seed: int) -> nnx.Rngs:
    """Init RNG streams on the `rbg` PRNG: on a CPU, compiling threefry for the ~70 tensors of the three
    networks costs several times what the init itself is worth."""
    return nnx.Rngs(params=jax.random.key(seed, impl="rbg"))


def build_codebook_model(cfg: CodebookModelConfig, seed: int = 0) -> CodebookModel:
    """A fresh model on the default device, initialised in one jitted call (op-by-op init of the
    many small tensors is far slower). Sharded runs use `sharding.create_sharded`."""

    def make() -> CodebookModel:
        return CodebookModel(cfg, rngs=init_rngs(seed))

    graphdef, _ = nnx.split(nnx.eval_shape(make))
    return nnx.merge(graphdef, jax.jit(lambda: nnx.split(make())[1])())


def _encode(graphdef: nnx.GraphDef, state: nnx.State, images: Array) -> tuple[Array, Array]:
    model = nnx.merge(graphdef, state)
    h = model.encode(images)
    return h, model.nearest(h)


# (graphdef [static], state, uint8 images) -> (H [b, N, d_c], nearest ids [b, N]); no noise
jit_encode = jax.jit(_encode, static_argnums=0)


def encode_images(model: CodebookModel, images: np.ndarray) -> np.ndarray:
    """Noise-free H [b, N, d_c] of uint8 images, jitted (one compile per image size)."""
    graphdef, state = nnx.split(model)
    return host_value(jit_encode(graphdef, state, jnp.asarray(images))[0])  # multi-process: gathered


def teacher_inputs(targets: Int[Array, "b t"]) -> tuple[Int[Array, "b t"], Bool[Array, "b t"]]:
    """targets [c_1..c_n, <eos>, <pad>..] -> (inputs [<bos>, c_1..c_n, <eos>, <pad>..][:t], mask)."""
    b = targets.shape[0]
    inputs = jnp.concatenate([jnp.full((b, 1), VOCAB.BOS, targets.dtype), targets[:, :-1]], axis=1)
    mask = jnp.concatenate([jnp.ones((b, 1), bool), targets[:, :-1] != VOCAB.PAD], axis=1)
    return inputs, mask


def char_dropout(inputs: Int[Array, "b t"], rate: float, rng: jax.Array) -> Int[Array, "b t"]:
    """Replaces real input characters (never <bos>/<eos>/<pad>) by <drop> with probability `rate`, so
    the decoder must read the prefix instead of leaning on its own language prior."""
    if rate <= 0:
        return inputs
    is_char = inputs >= VOCAB.NUM_SPECIAL
    drop = jax.random.bernoulli(rng, rate, inputs.shape) & is_char
    return jnp.where(drop, VOCAB.DROP, inputs)


# ----------------------------------------------------------------------------------------------
# Greedy reconstruction.


def _greedy(
    graphdef: nnx.GraphDef, max_len: int, state: nnx.State, feats: Float[Array, "b p dc"],
    n_valid: Int[Array, " b"], limits: Int[Array, " b"],
) -> Int[Array, "b m"]:
    model: CodebookModel = nnx.merge(graphdef, state)
    dec = model.decoder
    b, p = feats.shape[:2]
    # Never emit specials other than <eos>: they are not text.
    allowed = jnp.zeros((dec.cfg.vocab_size,), bool).at[VOCAB.NUM_SPECIAL:VOCAB.size].set(True)
    allowed = allowed.at[VOCAB.EOS].set(True)

    def pick(h: jax.Array) -> jax.Array:
        logits = dec.logits_from_hidden(h[:, -1:])[:, 0]
        return jnp.argmax(jnp.where(allowed, logits, -jnp.inf), axis=-1).astype(jnp.int32)

    # Prefixes are left-padded to p: padded slots are masked out of the cache and the real tokens
    # keep positions 0.., so a row decodes as it would alone.
    pad = p - n_valid
    slot = jnp.arange(p + 1, dtype=jnp.int32)[None, :]
    cache = dec.init_cache(b, p + 1 + max_len)
    x = jnp.concatenate([model.project(feats), dec.embed_tokens(jnp.full((b, 1), VOCAB.BOS, jnp.int32))], 1)
    # Weights sliced per layer once, and the cache turned into per-layer buffers by this prefill: the
    # loop below then copies neither, per token (transformer.run_layers).
    layers = dec.layer_slices()
    h, cache = dec.trunk_cached(x, jnp.maximum(slot - pad[:, None], 0), slot >= pad[:, None], cache, layers)
    out = jnp.full((b, max_len), VOCAB.PAD, jnp.int32)

    def cond(carry):
        i, _, done, _, _ = carry
        return (i < max_len) & ~jnp.all(done)

    def body(carry):
        i, tok, done, out, cache = carry
        out = out.at[:, i].set(jnp.where(done, VOCAB.PAD, tok))
        done = done | (tok == VOCAB.EOS) | (i + 1 >= limits)
        h, cache = dec.trunk_cached(dec.embed_tokens(tok[:, None]), (n_valid + 1 + i)[:, None], ~done[:, None], cache,
                                    layers)
        return i + 1, pick(h), done, out, cache

    carry = (jnp.int32(0), pick(h), limits <= 0, out, cache)
    return jax.lax.while_loop(cond, body, carry)[3]


_greedy_jit = jax.jit(_greedy, static_argnums=(0, 1))


def greedy_decode(
    model_or_split: CodebookModel | tuple[nnx.GraphDef, nnx.State],
    feats: Float[Array, "b p dc"],
    limits: Int[Array, " b"] | Sequence[int],
    max_len: int,
    n_valid: Int[Array, " b"] | Sequence[int] | None = None,
) -> np.ndarray:
    """Greedy character ids [b, max_len] (<pad> after <eos> or the row's limit) from prefix features
    (codebook rows or continuous H). Row i's prefix is its last `n_valid[i]` rows (left padding;
    default: all p). `limits[i]` caps row i's length (incl. <eos>). Shapes and `max_len` are static:
    bucket them to reuse compilations (`stages.codebook_models.LatentDecoder` does)."""
    if isinstance(model_or_split, tuple):
        graphdef, state = model_or_split
    else:
        graphdef, state = nnx.split(model_or_split)
    b, p = feats.shape[:2]
    n_valid = jnp.full((b,), p, jnp.int32) if n_valid is None else jnp.asarray(n_valid, jnp.int32)
    limits = jnp.minimum(jnp.asarray(limits, jnp.int32), max_len)
    return host_value(_greedy_jit(graphdef, int(max_len), state, jnp.asarray(feats), n_valid, limits))
