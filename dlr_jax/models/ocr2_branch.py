"""D_ocr when the codebook is the fine-tuned DeepSeek-OCR-2: stage sft's dual branch and the decoder that the
later stages read latent ids back with.

Training (`Ocr2Branch`, inside `dual_branch.DualBranchLM`): the OCR-2 decoder reconstructs the CoT y from
the latent input rows the LM consumes, behind a stop-gradient:

    z --LatentLM.embed_latents--> E_lat(z) [n, d_model] --stop_gradient--> --prefix_map M [d_model, code_dim]-->
      (quantize_at = flow: --the OCR-2 projector [d_c, D] + bias-->) image rows [n, D]
    decoder input: <bos> [image rows] [view separator] [OCR prompt] [y shifted right] --MoE decoder--> y

M is the learned linear map the issue asks for where the LM's width (d_model, 2560 for Qwen3-4B) differs from
what the decoder reads (the VQ width: d_c = 896 after the causal flow, or D at the projector): it trains with
the decoder, and it starts so that the branch computes what the codebook stage's decoder did. With
A = [W_in ; b_in] ((code_dim + 1) x d_model, P_in(c) = [c, 1] A), M = pinv(A) [I ; 0] gives E_lat(c) M = c for
every code c whenever d_model >= code_dim + 1 (every real backbone), so at step 0 the rows are exactly the
codebook stage's `image_embeddings` of C[z]; otherwise M is the least-squares fit. The projector, the view
separator and the decoder are the codebook stage's (taken over) and train with M; nothing else reads them.

The stop-gradient makes the OCR loss's gradient exactly zero on every LatentLM parameter, so the LM's
gradients are those of its own loss (tests/models/test_ocr2_branch.py checks both).

Decoding (`Ocr2CodeDecoder`, saved by sft to <workdir>/sft/decoder, or made from the codebook stage's model):
the decoder with, for every code k, the row it reads for k frozen in (`code_rows` [K, D]) and the view
separator; `reader()` gives the KV-cached `ocr2_reader.Ocr2Reader` that `generate.sampler.Sampler` drives.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.core.sharding import host_value, named_sharding, put_global
from dlr_jax.models.dual_branch import exact_prefix_init
from dlr_jax.models.latent_lm import LatentLM
from dlr_jax.models.ocr2_codebook import PAD, Ocr2CodebookConfig, Ocr2CodebookModel
from dlr_jax.models.ocr2_reader import Ocr2Reader
from dlr_jax.models.ocr2_text import Ocr2TextModel
from dlr_jax.models.transformer import causal_mask, segment_positions

MAP_AXES = (None, None)  # [d_model, code_dim]: small beside the decoder; replicated
CODE_ROW_AXES = ("codes", None)  # [K, D]


class Ocr2Branch(nnx.Module):
    """The OCR-2 decoder reading LM latent rows of width `feature_dim` (see the module docstring).

    text / projector / projector_bias / view_separator: the codebook stage's `Param`s (shared, not copied);
    prefix_map: [feature_dim, code_dim] start value (`exact_map_init`)."""

    def __init__(self, cfg: Ocr2CodebookConfig, *, text: Ocr2TextModel, prefix_map: Any, view_separator: nnx.Param,
                 projector: nnx.Param | None = None, projector_bias: nnx.Param | None = None):
        self.cfg = cfg
        if prefix_map.shape[1] != cfg.code_dim:
            raise ValueError(f"prefix_map has shape {tuple(prefix_map.shape)}: it must map to the VQ width "
                             f"{cfg.code_dim}")
        if cfg.quantize_at == "flow" and (projector is None or projector_bias is None):
            raise ValueError("quantize_at=flow: the branch needs the OCR-2 projector (d_c -> D) and its bias")
        self.prefix_map = nnx.Param(jnp.asarray(prefix_map, jnp.float32), logical_axes=MAP_AXES)
        self.text = text
        self.view_separator = view_separator
        if cfg.quantize_at == "flow":
            self.projector, self.projector_bias = projector, projector_bias

    @property
    def feature_dim(self) -> int:
        return int(self.prefix_map.shape[0])

    def image_rows(self, feats: Float[Array, "b n f"]) -> Float[Array, "b n D"]:
        """What the decoder reads for LM latent rows: M, then (quantize_at = flow) the OCR-2 projector."""
        dt = jnp.dtype(self.cfg.ocr2.text.base.dtype)
        c = jnp.einsum("bnf,fc->bnc", feats.astype(dt), self.prefix_map[...].astype(dt))
        if self.cfg.quantize_at == "flow":
            c = jnp.einsum("bnc,cd->bnd", c, self.projector[...].astype(dt)) + self.projector_bias[...].astype(dt)
        return c

    def decoder_logits(
        self, feats: Float[Array, "b n f"], targets: Int[Array, "b t"], prefix_mask: Bool[Array, "b n"] | None = None
    ) -> tuple[Float[Array, "b t v"], Float[Array, ""]]:
        """Teacher-forced logits [b, t, V] (logits[:, j] predicts targets[:, j]; PAD targets at the right) and the
        decoder's MoE load-balancing loss. `prefix_mask` marks the real rows of left-padded `feats` (None = all):
        a row reads `<bos> rows sep prompt` from its first real row on, with positions from 0, as it would alone."""
        cfg, text = self.cfg, self.text
        b, n = feats.shape[:2]
        t = targets.shape[1]
        dt = jnp.dtype(cfg.ocr2.text.base.dtype)
        real = jnp.ones((b, n), bool) if prefix_mask is None else prefix_mask
        start = (n - jnp.sum(real.astype(jnp.int32), axis=1))[:, None]  # the slot <bos> takes
        rows = jnp.concatenate([jnp.zeros((b, 1, text.cfg.base.hidden_size), dt), self.image_rows(feats)], axis=1)
        slot = jnp.arange(n + 1)[None, :]
        bos = text.embed_tokens(jnp.full((b, 1), cfg.bos_id, jnp.int32))
        prefix = jnp.where((slot == start)[..., None], bos, rows)
        sep = jnp.broadcast_to(self.view_separator[...].astype(dt), (b, 1, rows.shape[-1]))
        prompt = text.embed_tokens(jnp.broadcast_to(jnp.asarray(cfg.prompt_ids, jnp.int32), (b, len(cfg.prompt_ids))))
        inputs = targets[:, :-1]
        x = jnp.concatenate([prefix, sep, prompt, text.embed_tokens(jnp.maximum(inputs, 0))], axis=1)
        seg = jnp.concatenate([slot >= start, jnp.ones((b, 1 + len(cfg.prompt_ids)), bool), inputs != PAD],
                              axis=1).astype(jnp.int32)
        h, aux = text.trunk(x, segment_positions(seg), causal_mask(seg))
        n_prefix = n + 2 + len(cfg.prompt_ids)
        return text.logits_from_hidden(jax.lax.dynamic_slice_in_dim(h, n_prefix - 1, t, axis=1)), aux

    def for_decoding(self, lm_rows: Float[Array, "k f"]) -> Ocr2CodeDecoder:
        """The trained branch with the rows it reads for every code (from the LM's E_lat(k), `lm_rows`) frozen
        in: what later stages decode code ids with (shares the decoder and the separator; no copy)."""
        rows = self.image_rows(lm_rows[None])[0].astype(jnp.float32)
        return Ocr2CodeDecoder(self.cfg, rows.shape[0], text=self.text, code_rows=rows,
                               view_separator=self.view_separator)


class Ocr2CodeDecoder(nnx.Module):
    """D_ocr for decoding code ids: the OCR-2 decoder, `code_rows` [K, D] (the row it reads for code k) and the
    view separator. Params only, so `run.checkpoint.save_params` / `restore_params` keep all of it."""

    def __init__(self, cfg: Ocr2CodebookConfig, num_codes: int, *, rngs: nnx.Rngs | None = None,
                 text: Ocr2TextModel | None = None, code_rows: Any = None, view_separator: nnx.Param | None = None):
        self.cfg = cfg
        d = cfg.ocr2.text.base.hidden_size
        self.text = Ocr2TextModel(cfg.ocr2.text, rngs=rngs or nnx.Rngs(0)) if text is None else text
        rows = jnp.zeros((num_codes, d), jnp.float32) if code_rows is None else code_rows
        self.code_rows = nnx.Param(rows, logical_axes=CODE_ROW_AXES)
        self.view_separator = (nnx.Param(jnp.zeros((d,), jnp.float32), logical_axes=("norm",))
                               if view_separator is None else view_separator)

    @property
    def num_codes(self) -> int:
        return int(self.code_rows.shape[0])

    def reader(self) -> Ocr2Reader:
        """The KV-cached reader whose ids V + k (k < K) stand for code k and V + K for the view separator."""
        rows = _with_separator(self.code_rows[...], self.view_separator[...])
        return Ocr2Reader(self.text, rows)

    @staticmethod
    def from_codebook_model(model: Ocr2CodebookModel) -> Ocr2CodeDecoder:
        """The codebook stage's decoder, reading every code as the stage trained it to (`image_embeddings`)."""
        rows = _code_rows(model.ocr2.projector[...], model.ocr2.projector_bias[...], model.vq.codebook[...],
                          model.cfg.quantize_at == "flow", model.cfg.ocr2.text.base.dtype)
        return Ocr2CodeDecoder(model.cfg, rows.shape[0], text=model.ocr2.text, code_rows=rows,
                               view_separator=model.ocr2.view_separator)


@jax.jit
def _with_separator(rows: jax.Array, sep: jax.Array) -> jax.Array:
    return jnp.concatenate([rows.astype(jnp.float32), sep.astype(jnp.float32)[None]], axis=0)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _code_rows(projector, bias, codebook, project: bool, dtype: str) -> jax.Array:
    if not project:
        return codebook.astype(jnp.float32)
    dt = jnp.dtype(dtype)
    return (codebook.astype(dt) @ projector.astype(dt) + bias.astype(dt)).astype(jnp.float32)


def exact_map_init(lm: LatentLM, code_dim: int) -> jax.Array:
    """M [d_model, code_dim] with E_lat(c) M = c for every code c (see the module docstring); jnp, so it runs on
    sharded (multi-host) projector weights."""
    return exact_prefix_init(lm, jnp.eye(code_dim, dtype=jnp.float32))


def ocr2_branch_from_codebook_model(model: Ocr2CodebookModel, lm: LatentLM, *, mesh: jax.sharding.Mesh | None = None,
                                    rules: Any = "fsdp") -> Ocr2Branch:
    """The branch for `lm` on the codebook stage's OCR-2 network (its decoder, projector and separator taken over)."""
    m = exact_map_init(lm, model.cfg.code_dim)
    if mesh is not None and mesh.size > 1:  # multi-process safe: a global result gathered, then placed by its axes
        m = put_global(host_value(m), named_sharding(mesh, MAP_AXES, m.shape, rules))
    o = model.ocr2
    flow = model.cfg.quantize_at == "flow"
    return Ocr2Branch(model.cfg, text=o.text, prefix_map=m, view_separator=o.view_separator,
                      projector=o.projector if flow else None, projector_bias=o.projector_bias if flow else None)


__all__ = ["Ocr2Branch", "Ocr2CodeDecoder", "exact_map_init", "ocr2_branch_from_codebook_model"]
