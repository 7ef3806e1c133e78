"""DeepSeek-OCR-2's decoder as a KV-cached reader of embedding rows that are not tokens: how D_ocr decodes.

    prompt ids: text ids < V, and ids V + j standing for row j of `rows` [M, D]
      --embed (the text table, or `rows`)--> MoE decoder (ocr2_text.py) over a KV cache --> logits [.., V]

DeepSeek-OCR-2 puts its image embeddings (the projected query outputs, then the view separator) where the
prompt holds image tokens, in order. Here each such position names its row instead, so prompts with
prefixes of different lengths share a batch: `generate.sampler.Sampler` left-pads them and runs its jitted
prefill and `while_loop` decode, sharded as it shards the LM (`init_cache` / `trunk_cached` /
`logits_from_hidden` / `forward_cached` are the interface it drives). Generated ids are always text ids.

Rows for decoding latent codes (`code_rows`): [what the decoder reads for code k, k < K ; the view
separator], so the prompt of codes z_1..z_N is `<bos> V+z_1 .. V+z_N V+K <OCR prompt>`, the layout the
codebook stage trained the decoder on (`ocr2_codebook.Ocr2CodebookModel.decoder_logits`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.models.ocr2_text import Ocr2TextModel
from dlr_jax.models.transformer import KVCache


class ReaderRows(nnx.Variable):
    """Rows a reader's prompt can name (not a `Param`: decoding never trains them)."""


class Ocr2Reader(nnx.Module):
    """`text`: the OCR-2 MoE decoder (shared, not copied); `rows` [M, D]: the rows ids V..V+M-1 stand for."""

    def __init__(self, text: Ocr2TextModel, rows: Float[Array, "m d"]):
        if rows.ndim != 2 or rows.shape[1] != text.cfg.base.hidden_size:
            raise ValueError(f"rows must be [M, {text.cfg.base.hidden_size}], got {tuple(rows.shape)}")
        self.text = text
        self.rows = ReaderRows(rows)

    @property
    def text_vocab(self) -> int:
        return self.text.cfg.base.vocab_size

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])

    def embed_tokens(self, input_ids: Int[Array, "b t"]) -> Float[Array, "b t d"]:
        v = self.text_vocab
        own = self.text.embed_tokens(jnp.where(input_ids < v, input_ids, 0))
        extra = jnp.take(self.rows[...], jnp.clip(input_ids - v, 0, self.num_rows - 1), axis=0)
        return jnp.where((input_ids >= v)[..., None], extra.astype(own.dtype), own)

    def init_cache(self, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
        return self.text.init_cache(batch, max_len, dtype)

    def trunk_cached(
        self, x: Float[Array, "b t d"], positions: Int[Array, "b t"], token_mask: Bool[Array, "b t"], cache: KVCache
    ) -> tuple[Float[Array, "b t d"], KVCache]:
        return self.text.trunk_cached(x, positions, token_mask, cache)

    def logits_from_hidden(self, h: Float[Array, "b t d"]) -> Float[Array, "b t v"]:
        return self.text.logits_from_hidden(h)

    def forward_cached(
        self, input_ids: Int[Array, "b t"], positions: Int[Array, "b t"], token_mask: Bool[Array, "b t"],
        cache: KVCache,
    ) -> tuple[Float[Array, "b t v"], KVCache]:
        h, cache = self.trunk_cached(self.embed_tokens(input_ids), positions, token_mask, cache)
        return self.logits_from_hidden(h), cache


def code_prompt(codes: list[int], *, text_vocab: int, num_codes: int, bos_id: int,
                prompt_ids: tuple[int, ...] = ()) -> list[int]:
    """`<bos> V+z_1 .. V+z_N V+K <prompt>`: the reader's prompt for code ids z over `code_rows` of K codes."""
    return [bos_id, *(text_vocab + int(c) for c in codes), text_vocab + num_codes, *prompt_ids]


__all__ = ["Ocr2Reader", "ReaderRows", "code_prompt"]
