"""DeepSeek-OCR-2 (transformers' `DeepseekOcr2ForConditionalGeneration`), global view:

    pixel_values [b, 3, L, L] --SAM + compressor (vision.py)--> V [b, nv, d_c]
      --causal flow over [V ; query table] (causal_flow.py)--> H [b, nq, d_c]   (d_c = 896)
      --projector (Linear d_c -> D)--> [b, nq, D] ++ view_separator [D]      -> nq + 1 image embeddings
    input_ids --embed--> [b, t, D]; the positions holding `image_token_id` take the image embeddings
      in order (flattened over the batch, as torch's masked_scatter) --MoE decoder (ocr2_text.py)--> logits

The query table is the 144-row one (`query_768_resolution`) when nv <= 144, else the 256-row one
(`query_1024_resolution`); the whole table is fed, so nq = 144 or 256 whatever nv is (the real model
has nv = nq at 768 / 1024 px). Local crops (`pixel_values_local`) are not modelled: the codebook stage
renders one global view.

`quantize` (codebook stage) is applied to H (the causal-flow output, the paper's VQ point) or to the
projector output (the authors' released code), see `image_embeddings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from dlr_jax.models.causal_flow import CausalFlow, Encoder, EncoderConfig, flow_positions, hybrid_mask
from dlr_jax.models.ocr2_text import Ocr2TextConfig, Ocr2TextModel
from dlr_jax.models.transformer import _param as param
from dlr_jax.models.transformer import rms_norm, run_layers
from dlr_jax.sharding import constrain

SMALL_TABLE = 144  # rows of query_768_resolution; query_1024_resolution has 256 (= flow.num_queries)


@dataclasses.dataclass(frozen=True)
class Ocr2Config:
    text: Ocr2TextConfig
    encoder: EncoderConfig  # flow.num_queries = rows of the large (1024 px) query table
    image_token_id: int

    @property
    def d_c(self) -> int:
        return self.encoder.flow.hidden_size

    def num_queries(self, nv: int) -> int:
        return SMALL_TABLE if nv <= SMALL_TABLE else self.encoder.flow.num_queries


def flow_with_table(flow: CausalFlow, visual: Float[Array, "b nv d"], table: Float[Array, "n d"]) -> jax.Array:
    """Query-side outputs of the flow over [V ; table] (the whole table, as DeepSeek-OCR-2 feeds it)."""
    b, nv, d = visual.shape
    n = table.shape[0]
    dt = jnp.dtype(flow.cfg.dtype)
    x = jnp.concatenate([visual.astype(dt), jnp.broadcast_to(table.astype(dt), (b, n, d))], axis=1)
    x = constrain(x, ("batch", "length", "act_embed"))
    vv, qv = jnp.ones((b, nv), bool), jnp.ones((b, n), bool)
    h, _ = run_layers(flow.model_cfg, flow.layers.arrays(), x, flow_positions(vv, n), hybrid_mask(vv, qv))
    return rms_norm(h, flow.final_norm[...], flow.cfg.rms_norm_eps)[:, nv:]


def merge_image_embeddings(
    embeds: Float[Array, "b t D"], input_ids: Int[Array, "b t"], image: Float[Array, "m D"], image_token_id: int
) -> Float[Array, "b t D"]:
    """The k-th image-token position (row-major over the batch) takes image[k]. The caller provides
    exactly as many image tokens as image rows (transformers checks; a jitted step cannot)."""
    mask = input_ids == image_token_id
    rank = jnp.cumsum(mask.reshape(-1)) - 1
    picked = image[jnp.clip(rank, 0, image.shape[0] - 1)].reshape(embeds.shape).astype(embeds.dtype)
    return jnp.where(mask[..., None], picked, embeds)


class Ocr2Model(nnx.Module):
    """`model(input_ids, pixel_values=None) -> logits [b, t, V]` (pixel_values NCHW, normalised to [-1, 1]
    as DeepSeek-OCR-2's processor does, like transformers' forward)."""

    def __init__(self, cfg: Ocr2Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d_c, D = cfg.d_c, cfg.text.base.hidden_size
        pd = jnp.dtype(cfg.text.base.param_dtype)
        self.encoder = Encoder(cfg.encoder, rngs=rngs)  # its flow's query_pool = the large table
        self.query_small = param(rngs, (SMALL_TABLE, d_c), ("queries", "embed"), pd)
        self.projector = param(rngs, (d_c, D), (None, "embed"), pd)
        self.projector_bias = param(rngs, (D,), ("norm",), pd, "zeros")
        self.view_separator = param(rngs, (D,), ("norm",), pd)
        self.text = Ocr2TextModel(cfg.text, rngs=rngs)

    def flow_features(self, images: Float[Array, "b L L 3"], n_queries: int | None = None) -> Float[Array, "b n dc"]:
        """H, the causal-flow output for NHWC images: the paper's VQ point (d_c wide). With
        `n_queries` only the table's first rows run; by the causal mask on the query side those
        outputs equal the first rows of a full-table run (the codebook stage takes n = nv)."""
        visual = self.encoder.vision(images)
        nv = visual.shape[1]
        table = self.query_small[...] if nv <= SMALL_TABLE else self.encoder.flow.query_pool[...]
        return flow_with_table(self.encoder.flow, visual, table if n_queries is None else table[:n_queries])

    def project(self, h: Float[Array, "b n dc"]) -> Float[Array, "b n D"]:
        dt = jnp.dtype(self.cfg.text.base.dtype)
        return (jnp.einsum("bnc,cd->bnd", h.astype(dt), self.projector[...].astype(dt))
                + self.projector_bias[...].astype(dt))

    def image_embeddings(
        self,
        images: Float[Array, "b L L 3"],
        quantize: Callable[[jax.Array], jax.Array] | None = None,
        quantize_at: str = "flow",
    ) -> Float[Array, "b n1 D"]:
        """[b, nq + 1, D]: projected flow outputs then the view separator. `quantize` maps features
        to their quantised version at `quantize_at` = "flow" (d_c, the paper) or "projector" (D, the
        authors' released code)."""
        h = self.flow_features(images)
        if quantize is not None and quantize_at == "flow":
            h = quantize(h)
        z = self.project(h)
        if quantize is not None and quantize_at == "projector":
            z = quantize(z)
        sep = jnp.broadcast_to(self.view_separator[...].astype(z.dtype), (z.shape[0], 1, z.shape[-1]))
        return jnp.concatenate([z, sep], axis=1)

    def embed(
        self, input_ids: Int[Array, "b t"], image_embeds: Float[Array, "bi n1 D"] | None = None
    ) -> Float[Array, "b t D"]:
        x = self.text.embed_tokens(input_ids)
        if image_embeds is None:
            return x
        flat = image_embeds.reshape(-1, image_embeds.shape[-1])
        return merge_image_embeddings(x, input_ids, flat, self.cfg.image_token_id)

    def __call__(
        self,
        input_ids: Int[Array, "b t"],
        pixel_values: Float[Array, "bi 3 L L"] | None = None,
        *,
        attention_mask: Int[Array, "b t"] | None = None,
    ) -> Float[Array, "b t v"]:
        image = None
        if pixel_values is not None:
            image = self.image_embeddings(jnp.transpose(pixel_values, (0, 2, 3, 1)))
        x = self.embed(input_ids, image)
        h, _ = self.text.hidden_states(input_ids, inputs_embeds=x, attention_mask=attention_mask)
        return self.text.logits_from_hidden(h)


def build_ocr2(cfg: Ocr2Config, seed: int = 0) -> Ocr2Model:
    return Ocr2Model(cfg, rngs=nnx.Rngs(params=seed))
