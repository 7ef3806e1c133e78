"""Stage sft's dual branch: the OCR decoder keeps learning to read the CoT y back from
the latent input rows the LM consumes, behind a stop-gradient.

    z --LatentLM.embed_latents--> E_lat(z) = P_in(C[z])  [n, d_model]
      --stop_gradient--> --prefix_proj W [d_model, d_dec]--> [W E ; <bos> y] --char decoder--> y

The decoder reads E_lat, not C[z] through the codebook stage's own d_c projection, because the
branch is to read the rows the LM actually sees: with the codebook and P_in both training in sft, the branch
follows the LM's latent inputs. Since E_lat is affine in C[z] the information is the same; what
changes is only which drift the decoder has to track.

W is new. It starts so that the branch computes exactly what the codebook stage's decoder did:
with A = [W_in ; b_in] [(d_c + 1), d_model] (P_in(c) = [c, 1] A), W = pinv(A) [P ; 0] gives
E_lat(c) W = [c, 1] A pinv(A) [P ; 0] = c P for every code c whenever A has full row rank, i.e.
d_model >= d_c + 1 (every config); otherwise W is the least-squares fit. Without this the first
sft steps would train the decoder against a random prefix and undo the codebook stage's work.

The stop-gradient makes the OCR loss's gradient exactly zero on every LatentLM parameter; the two
branches share only forward values (tests/models/test_dual_branch.py checks it).

Saved for decoding (`OCRBranch` with `code_rows`): the decoder half of a `CodebookModel` with the
same parameter names: `vq/codebook` [K, d_model] holds the frozen rows E_lat(k) at the end of sft,
then `prefix_proj` [d_model, d_dec] and `decoder/...`. `stages.codebook_models.LatentDecoder` decodes code
ids with it unchanged (it reads `vq.codebook`, `project`, `decoder` and `cfg.max_text_len`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.core.sharding import host_value, named_sharding, put_global
from dlr_jax.models.codebook_model import CodebookModel, CodebookModelConfig
from dlr_jax.models.latent_lm import LatentLM
from dlr_jax.models.transformer import Transformer, causal_mask, segment_positions

PREFIX_AXES = (None, "embed")  # [d_model, d_dec]: d_dec is the decoder's embed dim
ROW_AXES = ("codes", None)  # [K, d_model]


class CodeRows(nnx.Module):
    """`codebook` [K, d]: the prefix row each code id reads (named like `VectorQuantizer.codebook`,
    so decoding code ids works as with a `CodebookModel`)."""

    def __init__(self, rows: Any):
        self.codebook = nnx.Param(jnp.asarray(rows, jnp.float32), logical_axes=ROW_AXES)


class OCRBranch(nnx.Module):
    """The codebook stage's character decoder reading prefix features of width `feature_dim`.

    decoder / prefix_proj: existing pieces (e.g. the codebook stage's decoder and `exact_prefix_init`);
    fresh ones are initialised from `rngs` when None. code_rows: [K, feature_dim] frozen rows for
    decoding code ids (`vq.codebook`); None while training, where features come from the LM.
    """

    def __init__(
        self,
        cfg: CodebookModelConfig,
        feature_dim: int,
        *,
        rngs: nnx.Rngs,
        decoder: Transformer | None = None,
        prefix_proj: Any = None,
        code_rows: Any = None,
    ):
        self.cfg = cfg
        shape = (feature_dim, cfg.decoder.hidden_size)
        pd = jnp.dtype(cfg.decoder.param_dtype)
        if prefix_proj is None:
            prefix_proj = jax.random.normal(rngs.params(), shape, jnp.float32) / math.sqrt(feature_dim)
        if tuple(prefix_proj.shape) != shape:
            raise ValueError(
                f"prefix_proj has shape {tuple(prefix_proj.shape)}, expected (feature_dim, d_dec) = {shape}"
            )
        self.prefix_proj = nnx.Param(jnp.asarray(prefix_proj).astype(pd), logical_axes=PREFIX_AXES)
        self.decoder = Transformer(cfg.decoder, rngs=rngs) if decoder is None else decoder
        if code_rows is not None:
            if np.shape(code_rows)[-1] != feature_dim:
                raise ValueError(f"code_rows have width {np.shape(code_rows)[-1]}, expected {feature_dim}")
            self.vq = CodeRows(code_rows)

    @property
    def feature_dim(self) -> int:
        return int(self.prefix_proj.shape[0])

    def project(self, feats: Float[Array, "b n f"]) -> Float[Array, "b n d"]:
        dt = jnp.dtype(self.cfg.decoder.dtype)
        return jnp.einsum("bnf,fd->bnd", feats.astype(dt), self.prefix_proj[...].astype(dt))

    def decoder_logits(
        self,
        feats: Float[Array, "b n f"],
        inputs: Int[Array, "b t"],
        input_mask: Bool[Array, "b t"],
        prefix_mask: Bool[Array, "b n"] | None = None,
    ) -> Float[Array, "b t v"]:
        """`CodebookModel.decoder_logits` with a left-padded prefix: `prefix_mask` marks the real rows,
        which must sit at the right end (None = all real). The real rows get positions 0.., so a
        padded row reads exactly as it would alone; padded rows attend to and are seen by nothing."""
        b, n = feats.shape[:2]
        real = jnp.ones((b, n), bool) if prefix_mask is None else prefix_mask
        dec = self.decoder
        x = jnp.concatenate([self.project(feats), dec.embed_tokens(inputs)], axis=1)
        seg = jnp.concatenate([real.astype(jnp.int32), input_mask.astype(jnp.int32)], axis=1)
        h, _ = dec.trunk(x, segment_positions(seg), causal_mask(seg))
        return dec.logits_from_hidden(h[:, n:])


def exact_prefix_init(lm: LatentLM, codebook_prefix: Float[Array, "c d"]) -> Float[Array, "m d"]:
    """W [d_model, d_dec] with P_in(c) W = c P for every c (see the module docstring); computed with
    jnp so it runs on sharded (multi-host) projector weights."""
    kernel, bias = lm.p_in.kernel[...], lm.p_in.bias[...]
    if kernel.shape[0] != codebook_prefix.shape[0]:
        raise ValueError(
            f"the LM's codebook width d_c={kernel.shape[0]} differs from the OCR decoder's prefix input "
            f"{codebook_prefix.shape[0]}: was the latent LM built from this codebook stage?"
        )

    @jax.jit
    def solve(kernel, bias, target):
        a = jnp.concatenate([kernel, bias[None]], axis=0).astype(jnp.float32)
        rhs = jnp.concatenate([target.astype(jnp.float32), jnp.zeros((1, target.shape[1]), jnp.float32)], axis=0)
        return jnp.linalg.pinv(a) @ rhs

    return solve(kernel, bias, codebook_prefix)


def branch_from_codebook_model(
    model: CodebookModel, lm: LatentLM, *, mesh: jax.sharding.Mesh | None = None, rules: Any = "fsdp"
) -> OCRBranch:
    """The OCR branch for `lm`: the codebook stage's decoder (taken over, not copied) and a new
    prefix projection from d_model that starts exactly where the stage's own d_c projection was."""
    w = exact_prefix_init(lm, model.prefix_proj[...])
    if mesh is not None and mesh.size > 1:  # multi-process safe: a global result gathered, then placed by its axes
        w = put_global(host_value(w), named_sharding(mesh, PREFIX_AXES, w.shape, rules))
    return OCRBranch(model.cfg, lm.backbone.cfg.hidden_size, rngs=nnx.Rngs(0), decoder=model.decoder, prefix_proj=w)


class DualBranchLM(nnx.Module):
    """The latent LM and its OCR branch under one module, so one trainer state holds both.

    Parameter paths: `lm/...` (the `LatentLM`'s) and `ocr/{prefix_proj,decoder/...}`.
    """

    def __init__(self, lm: LatentLM, ocr: OCRBranch):
        d = lm.backbone.cfg.hidden_size
        if ocr.feature_dim != d:
            raise ValueError(f"the OCR branch reads width {ocr.feature_dim}, the LM's latent rows have {d}")
        self.lm, self.ocr = lm, ocr

    def latent_features(self, codes: Int[Array, "b n"]) -> Float[Array, "b n d"]:
        """sg(E_lat(z)): the LM's latent input rows, cut off from the LM's gradient."""
        return jax.lax.stop_gradient(self.lm.embed_latents(codes))

    def ocr_logits(
        self,
        codes: Int[Array, "b n"],
        code_mask: Bool[Array, "b n"],
        inputs: Int[Array, "b t"],
        input_mask: Bool[Array, "b t"],
    ) -> Float[Array, "b t v"]:
        """Teacher-forced char logits from left-padded code ids (`OCRBranch.decoder_logits`)."""
        return self.ocr.decoder_logits(self.latent_features(codes), inputs, input_mask, code_mask)

    def code_rows(self) -> Float[Array, "k d"]:
        """E_lat(k) for every code k [K, d_model] (fp32), computed as in training."""
        k = self.lm.latent_cfg.num_latents
        return self.lm.embed_latents(jnp.arange(k, dtype=jnp.int32)[None])[0].astype(jnp.float32)

    def decoder_for_decoding(self) -> Any:
        """The trained branch with the current rows E_lat(k) frozen in: what later stages decode
        code ids with (shares the decoder and projection; no copy). An OCR-2 branch
        (`ocr2_branch.Ocr2Branch`) gives its `Ocr2CodeDecoder`."""
        o = self.ocr
        if hasattr(o, "for_decoding"):
            return o.for_decoding(self.code_rows())
        return OCRBranch(o.cfg, o.feature_dim, rngs=nnx.Rngs(0), decoder=o.decoder, prefix_proj=o.prefix_proj[...],
                         code_rows=self.code_rows())


OCR_PARAMS = nnx.All(nnx.Param, nnx.PathContains("ocr"))

__all__ = [
    "OCR_PARAMS", "CodeRows", "DualBranchLM", "OCRBranch", "branch_from_codebook_model", "exact_prefix_init",
]
