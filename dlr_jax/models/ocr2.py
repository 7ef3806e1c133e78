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

Per-CoT canvases (the paper: side L = the smallest multiple of 64 that holds the CoT, N = (L/64)^2 codes)
give nv = N that is neither 144 nor 256: the codebook network runs the first N rows of the table
(`flow_features(n_queries=nv)`). Which table: the one the released model itself picks for nv visual tokens
(transformers' `DeepseekOcr2VisionModel.forward`: `query_768_resolution` when nv <= 144), so a 64-px canvas
(nv = 1) reads row 0, a 128-px one (nv = 4) rows 0-3 and a 768-px one (nv = 144) all of
`query_768_resolution`; 832 px and up (nv >= 169) read the first nv rows of `query_1024_resolution`. Why the
first rows: the queries are a causal sequence (query i attends to the visual tokens and queries 0..i only),
so the first N outputs of a run over the whole table are exactly those of a run over its first N rows; no
other subset of rows is an output the pretrained model produces. The rows are learnt as a 1-D reading
order, not a 12 x 12 / 16 x 16 grid laid over the image (each query attends to every visual token; the
grid sizes only fix the counts). The real checkpoint's weights were not available where this was written,
so that the first rows read well at small N rests on this structure and on fine-tuning the codebook
stage, which trains the rows it uses.

`quantize` (codebook stage) is applied to H (the causal-flow output, the paper's VQ point) or to the
projector output (the authors' released code), see `image_embeddings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from dlr_jax.config import ModelConfig
from dlr_jax.core.sharding import constrain
from dlr_jax.models.causal_flow import CausalFlow, CausalFlowConfig, Encoder, EncoderConfig, flow_positions, hybrid_mask
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.models.moe import MoeConfig
from dlr_jax.models.ocr2_text import Ocr2TextConfig, Ocr2TextModel
from dlr_jax.models.transformer import new_param as param
from dlr_jax.models.transformer import rms_norm, run_layers
from dlr_jax.models.vision import VisionConfig

MODEL_TYPE = "deepseek_ocr2"
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


# ----------------------------------------------------------------------------------------------
# config.json (transformers' DeepseekOcr2Config) <-> Ocr2Config: the checkpoint importer
# (convert/ocr2.py) and the codebook stage's saved config (ocr2_codebook.py) both read and write it.


def _rope(d: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    rp = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = float(rp.pop("rope_theta", d.get("rope_theta", 10000.0)))
    kind = rp.get("rope_type", rp.get("type", "default"))
    return theta, (None if kind in ("default", None) else rp)


def ocr2_config_from_hf(
    raw: Mapping[str, Any], *, dtype: str = "float32", compute_dtype: str | None = None, remat: str = "none"
) -> Ocr2Config:
    """config.json dict of a deepseek_ocr2 checkpoint -> Ocr2Config; `dtype` of the parameters,
    `compute_dtype` of the activations (default: dtype), `remat` of every layer stack."""
    cd = compute_dtype or dtype
    if raw.get("model_type") != MODEL_TYPE:
        raise ConversionError(f"model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
    t = dict(raw.get("text_config") or {})
    vc = dict(raw.get("vision_config") or {})
    sam, enc = dict(vc.get("sam_config") or {}), dict(vc.get("encoder_config") or {})
    if t.get("attention_bias") or t.get("mlp_bias"):
        raise ConversionError("text_config: attention_bias / mlp_bias are not supported (DeepSeek-OCR-2 has none)")
    L, d = int(t.get("num_hidden_layers", 32)), int(t.get("hidden_size", 4096))
    h = int(t.get("num_attention_heads", 32))
    theta, scaling = _rope(t)
    base = ModelConfig(
        model_type=MODEL_TYPE, vocab_size=int(t.get("vocab_size", 102400)), hidden_size=d,
        intermediate_size=int(t.get("intermediate_size", 11008)), num_layers=L, num_heads=h,
        num_kv_heads=int(t.get("num_key_value_heads") or h), head_dim=d // h,
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(t.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), dtype=cd, param_dtype=dtype, remat=remat,
        bos_token_id=t.get("bos_token_id", 1), eos_token_id=t.get("eos_token_id", 2),
        pad_token_id=t.get("pad_token_id"),
    )
    moe = MoeConfig(
        hidden_size=d, moe_intermediate_size=int(t.get("moe_intermediate_size", 1407)),
        num_experts=int(t.get("n_routed_experts", 64)), num_experts_per_tok=int(t.get("num_experts_per_tok") or 1),
        n_shared_experts=int(t.get("n_shared_experts") or 0),
        routed_scaling_factor=float(t.get("routed_scaling_factor", 1.0)),
        topk_method=t.get("topk_method") or "greedy", n_group=t.get("n_group"), topk_group=t.get("topk_group"),
        norm_topk_prob=bool(t.get("norm_topk_prob", False)), dtype=cd, param_dtype=dtype,
    )
    types = t.get("mlp_layer_types")
    if types is None:  # DeepSeek-V2 style: first_k_dense_replace dense layers, then sparse
        k = int(t.get("first_k_dense_replace", 0))
        types = ["dense"] * k + ["sparse"] * (L - k)
    hs = int(sam.get("hidden_size", 768))
    vision = VisionConfig(
        image_size=int(sam.get("image_size", 1024)), patch_size=int(sam.get("patch_size", 16)),
        num_channels=int(sam.get("num_channels", 3)), hidden_size=hs,
        num_layers=int(sam.get("num_hidden_layers", 12)), num_heads=int(sam.get("num_attention_heads", 12)),
        mlp_dim=int(sam.get("mlp_dim") or hs * float(sam.get("mlp_ratio", 4.0))),
        global_attn_indexes=tuple(sam.get("global_attn_indexes", (2, 5, 8, 11))),
        window_size=int(sam.get("window_size", 14)), qkv_bias=bool(sam.get("qkv_bias", True)),
        layer_norm_eps=float(sam.get("layer_norm_eps", 1e-6)), neck_channels=int(sam.get("output_channels", 256)),
        compressor_channels=tuple(sam.get("downsample_channels") or (512, 896)), dtype=cd, param_dtype=dtype,
        remat=remat,
    )
    fh, fheads = int(enc.get("hidden_size", 4096)), int(enc.get("num_attention_heads", 32))
    ftheta, _ = _rope(enc)
    flow = CausalFlowConfig(
        hidden_size=fh, intermediate_size=int(enc.get("intermediate_size", 22016)),
        num_layers=int(enc.get("num_hidden_layers", 32)), num_heads=fheads,
        num_kv_heads=int(enc.get("num_key_value_heads") or fheads), head_dim=fh // fheads,
        rms_norm_eps=float(enc.get("rms_norm_eps", 1e-6)), rope_theta=ftheta, num_queries=256,
        dtype=cd, param_dtype=dtype, remat=remat,
    )
    return Ocr2Config(Ocr2TextConfig(base, moe, tuple(types)), EncoderConfig(vision, flow),
                      image_token_id=int(raw.get("image_token_id", 128815)))


def hf_config_dict(cfg: Ocr2Config, dtype: str) -> dict[str, Any]:
    """config.json that transformers reads back as the same DeepseekOcr2Config."""
    b, m, v, f = cfg.text.base, cfg.text.moe, cfg.encoder.vision, cfg.encoder.flow
    rope = {"rope_type": "default", **(b.rope_scaling or {}), "rope_theta": b.rope_theta}
    text = dict(
        model_type="deepseek_ocr2_text", vocab_size=b.vocab_size, hidden_size=b.hidden_size,
        intermediate_size=b.intermediate_size, num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads, rms_norm_eps=b.rms_norm_eps, rope_parameters=rope,
        max_position_embeddings=b.max_position_embeddings, bos_token_id=b.bos_token_id,
        eos_token_id=list(b.eos_token_id) if isinstance(b.eos_token_id, tuple) else b.eos_token_id,
        pad_token_id=b.pad_token_id, n_routed_experts=m.num_experts, num_experts_per_tok=m.num_experts_per_tok,
        n_shared_experts=m.n_shared_experts, moe_intermediate_size=m.moe_intermediate_size,
        routed_scaling_factor=m.routed_scaling_factor, topk_method=m.topk_method, n_group=m.n_group,
        topk_group=m.topk_group, mlp_layer_types=list(cfg.text.mlp_layer_types), hidden_act="silu",
    )
    sam = dict(
        model_type="deepseek_ocr2_sam_vision_model", hidden_size=v.hidden_size, output_channels=v.neck_channels,
        num_hidden_layers=v.num_layers, num_attention_heads=v.num_heads, num_channels=v.num_channels,
        image_size=v.image_size, patch_size=v.patch_size, layer_norm_eps=v.layer_norm_eps, qkv_bias=v.qkv_bias,
        window_size=v.window_size, global_attn_indexes=list(v.global_attn_indexes), mlp_dim=v.mlp_dim,
        downsample_channels=list(v.compressor_channels),
    )
    enc = dict(
        model_type="deepseek_ocr2_encoder", hidden_size=f.hidden_size, intermediate_size=f.intermediate_size,
        num_hidden_layers=f.num_layers, num_attention_heads=f.num_heads, num_key_value_heads=f.num_kv_heads,
        rms_norm_eps=f.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": f.rope_theta},
    )
    return {"architectures": ["DeepseekOcr2ForConditionalGeneration"], "model_type": MODEL_TYPE,
            "image_token_id": cfg.image_token_id, "tie_word_embeddings": b.tie_embeddings, "dtype": dtype,
            "text_config": text, "vision_config": {"sam_config": sam, "encoder_config": enc}}
