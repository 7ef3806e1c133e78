"""The codebook network on a pretrained DeepSeek-OCR-2 (`codebook.init_from`):

    image --SAM + compressor + causal flow (pretrained)--> H [b, N, d_c]     N = nv, the visual tokens
      --VQ (quantize_at = "flow": here, d_c = 896, the paper)--> H_st
      --projector--> [b, N, D] (quantize_at = "projector": the VQ sits here instead, D wide, as the
        authors' released code does) ++ view_separator
    decoder input: <bos> [image embeddings] [prompt tokens] [target tokens shifted right]
      --pretrained MoE decoder--> next-token logits over the OCR2 tokenizer's vocabulary

The interface matches `codebook_model.CodebookModel` where the stage's shared code uses it
(`encode` uint8 images -> features at the VQ point, `nearest`, `codes_to_features`, `cfg.num_codes`,
`cfg.code_dim`), so k-means warm start, dead-code refresh and export (`stages/export.py`) run
unchanged. Text is token ids (targets padded with `PAD` = -1), not characters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from dlr_jax.config import ConfigError
from dlr_jax.models.ocr2 import Ocr2Config, Ocr2Model
from dlr_jax.models.transformer import causal_mask, segment_positions
from dlr_jax.models.vision import normalize_images
from dlr_jax.models.vq import VectorQuantizer, nearest_codes

PAD = -1  # target padding (token ids are all >= 0)


@dataclasses.dataclass(frozen=True)
class Ocr2CodebookConfig:
    ocr2: Ocr2Config
    num_codes: int
    sigma: float = 0.0
    max_text_len: int = 512  # target tokens incl. <eos>
    quantize_at: str = "flow"  # flow (the paper, d_c) | projector (the released code, D)
    prompt_ids: tuple[int, ...] = ()  # tokens between the image and the text (e.g. "\nFree OCR.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(i) for i in self.prompt_ids))
        if self.quantize_at not in ("flow", "projector"):
            raise ConfigError(f"codebook.quantize_at must be flow | projector, got {self.quantize_at!r}")

    @property
    def code_dim(self) -> int:
        return self.ocr2.d_c if self.quantize_at == "flow" else self.ocr2.text.base.hidden_size

    @property
    def num_queries(self) -> int:
        return self.ocr2.encoder.flow.num_queries

    @property
    def bos_id(self) -> int:
        return int(self.ocr2.text.base.bos_token_id or 0)

    @property
    def eos_id(self) -> int:
        eos = self.ocr2.text.base.eos_token_id
        return int(eos[0] if isinstance(eos, tuple | list) else eos or 0)

    def to_dict(self) -> dict[str, Any]:
        from dlr_jax.models.ocr2 import hf_config_dict

        return {"kind": "ocr2", "ocr2": hf_config_dict(self.ocr2, self.ocr2.text.base.param_dtype),
                "num_codes": self.num_codes, "sigma": self.sigma, "max_text_len": self.max_text_len,
                "quantize_at": self.quantize_at, "prompt_ids": list(self.prompt_ids),
                "compute_dtype": self.ocr2.text.base.dtype, "remat": self.ocr2.text.base.remat}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Ocr2CodebookConfig:
        from dlr_jax.models.ocr2 import ocr2_config_from_hf

        ocr2 = ocr2_config_from_hf(d["ocr2"], dtype=d["ocr2"].get("dtype") or "float32",
                                   compute_dtype=d.get("compute_dtype"), remat=d.get("remat", "none"))
        return Ocr2CodebookConfig(ocr2, int(d["num_codes"]), float(d.get("sigma", 0.0)),
                                  int(d.get("max_text_len", 512)), d.get("quantize_at", "flow"),
                                  tuple(d.get("prompt_ids", ())))


class Ocr2CodebookModel(nnx.Module):
    def __init__(self, cfg: Ocr2CodebookConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.ocr2 = Ocr2Model(cfg.ocr2, rngs=rngs)
        self.vq = VectorQuantizer(cfg.num_codes, cfg.code_dim, sigma=cfg.sigma, rngs=rngs)

    def encode(self, images: Array) -> Float[Array, "b n dc"]:
        """uint8 images [b, L, L] (grey) or [b, L, L, 3] -> features at the VQ point [b, nv, code_dim]."""
        if images.ndim == 3:
            images = jnp.repeat(images[..., None], 3, axis=-1)
        x = normalize_images(images)
        nv = self.cfg.ocr2.encoder.vision.num_tokens(x.shape[1], x.shape[2])
        h = self.ocr2.flow_features(x, n_queries=nv)
        return h if self.cfg.quantize_at == "flow" else self.ocr2.project(h)

    def nearest(self, h: Float[Array, "b n dc"]) -> Int[Array, "b n"]:
        return nearest_codes(h, self.vq.codebook[...])

    def codes_to_features(self, ids: Int[Array, "b n"]) -> Float[Array, "b n dc"]:
        return jnp.take(self.vq.codebook[...], ids, axis=0)

    def image_embeddings(self, feats: Float[Array, "b n dc"]) -> Float[Array, "b n1 D"]:
        z = self.ocr2.project(feats) if self.cfg.quantize_at == "flow" else feats
        sep = self.ocr2.view_separator[...].astype(z.dtype)
        return jnp.concatenate([z, jnp.broadcast_to(sep, (z.shape[0], 1, z.shape[-1]))], axis=1)

    def decoder_logits(
        self, feats: Float[Array, "b n dc"], targets: Int[Array, "b t"]
    ) -> tuple[Float[Array, "b t v"], Float[Array, ""]]:
        """Teacher-forced logits [b, t, V] (logits[:, j] predicts targets[:, j]) and the decoder's
        MoE load-balancing loss. Input: <bos> image prompt targets[:, :-1]; PAD targets at the right."""
        cfg, text = self.cfg, self.ocr2.text
        b, t = targets.shape
        img = self.image_embeddings(feats)
        prefix_ids = jnp.asarray([cfg.bos_id], jnp.int32)
        prompt = jnp.asarray(cfg.prompt_ids, jnp.int32)
        inputs = targets[:, :-1]
        x = jnp.concatenate([
            text.embed_tokens(jnp.broadcast_to(prefix_ids, (b, 1))), img.astype(jnp.dtype(cfg.ocr2.text.base.dtype)),
            text.embed_tokens(jnp.broadcast_to(prompt, (b, len(cfg.prompt_ids)))),
            text.embed_tokens(jnp.maximum(inputs, 0)),
        ], axis=1)
        n_prefix = 1 + img.shape[1] + len(cfg.prompt_ids)
        seg = jnp.concatenate([jnp.ones((b, n_prefix), jnp.int32), (inputs != PAD).astype(jnp.int32)], axis=1)
        h, aux = text.trunk(x, segment_positions(seg), causal_mask(seg))
        return text.logits_from_hidden(jax.lax.dynamic_slice_in_dim(h, n_prefix - 1, t, axis=1)), aux
