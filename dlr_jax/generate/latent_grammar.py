"""Constrained latent decoding (evaluation and RL rollouts): a pure logits processor, jitted inside
the sampler's decode loop, that caps the latent span and (optionally) enforces the output grammar

    <latent> z_1 .. z_n </latent> <answer> a </answer>

(the rules are in `dlr_jax.eval.evaluate`'s docstring), and the vocabulary mask of each decoding mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from dlr_jax.text.tokens import Tokenizer


def latent_processor_aux(tok: Tokenizer, *, limit: int, constrain: bool) -> dict[str, np.ndarray]:
    """`processor_aux` for `latent_phase_processor`: all traced, so other values (another n) reuse
    the compiled decode loop."""
    ids = [tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id, tok.eos_id]
    return {
        "ids": np.asarray(ids, np.int32),
        "latents": np.asarray([tok.latent_offset, tok.num_latents], np.int32),
        "limit": np.int32(limit),
        "constrain": np.bool_(constrain),
    }


def latent_phase_processor(
    logits: Float[Array, "b v"], tokens: Int[Array, "b n"], step: Int[Array, ""], aux: Mapping[str, Any]
) -> Float[Array, "b v"]:
    """Forces `</latent>` once a row has `aux["limit"]` latents in its open span and, with
    `aux["constrain"]`, applies the format grammar of the module docstring.

    The per-row phase (span opened / closed, answer opened / closed, latents so far) is derived from
    the tokens generated so far (`tokens[:, :step]`) with counts and cumulative sums: no carried state.
    """
    ls, le, a_s, a_e, eos = (aux["ids"][i] for i in range(5))
    off, k = aux["latents"][0], aux["latents"][1]
    valid = jnp.arange(tokens.shape[1])[None, :] < step
    hit = lambda t: (tokens == t) & valid  # noqa: E731
    has = lambda t: jnp.any(hit(t), axis=1, keepdims=True)  # noqa: E731  [b, 1]
    opened = jnp.cumsum(hit(ls), axis=1) > 0
    closed = jnp.cumsum(hit(le), axis=1) > 0
    latents = (tokens >= off) & (tokens < off + k) & valid & opened & ~closed  # first span only
    n_lat = jnp.sum(latents, axis=1, keepdims=True)
    in_span = has(ls) & ~has(le)

    v = jnp.arange(logits.shape[-1])[None, :]
    is_ = lambda t: v == t  # noqa: E731
    lat_col = (v >= off) & (v < off + k)
    text_after = ~lat_col & ~is_(ls) & ~is_(le)
    grammar = jnp.where(
        ~has(ls), is_(ls),
        jnp.where(in_span, lat_col | is_(le),
                  text_after & jnp.where(~has(a_s), ~is_(a_e) & ~is_(eos),
                                         jnp.where(~has(a_e), ~is_(a_s) & ~is_(eos), ~is_(a_s) & ~is_(a_e)))),
    )
    allowed = jnp.where(aux["constrain"], grammar, True)
    allowed = jnp.where(in_span & (n_lat >= aux["limit"]), is_(le), allowed)
    return jnp.where(allowed, logits, -jnp.inf)


def eval_vocab_mask(tok: Tokenizer, vocab: int, mode: str, constrain: bool) -> np.ndarray:
    """Bool [vocab]: ids that may be generated (padding rows never; latents only in latent mode)."""
    known = tok.vocab_padding_mask()
    mask = np.zeros(vocab, bool)
    n = min(vocab, known.shape[0])
    mask[:n] = known[:n]
    if mode != "latent" and constrain:
        mask[tok.latent_offset : tok.latent_offset + tok.num_latents] = False
        mask[[tok.latent_start_id, tok.latent_end_id]] = False
    return mask


def _forced(tokens: Int[Array, "b n"], lengths: Int[Array, " b"], aux: Mapping[str, Any],
            vocab_mask: Any) -> Any:
    vm = jnp.asarray(vocab_mask, bool)
    zeros = jnp.zeros((tokens.shape[0], vm.shape[0]), jnp.float32)

    def at(step: jax.Array) -> jax.Array:
        allowed = jnp.isfinite(latent_phase_processor(zeros, tokens, step, aux)) & vm
        return jnp.sum(allowed, axis=-1) == 1

    forced = jax.lax.map(at, jnp.arange(tokens.shape[1])).T  # one [b, v] row of choices at a time
    return forced & (jnp.arange(tokens.shape[1])[None, :] < lengths[:, None])


forced_tokens = jax.jit(_forced)
forced_tokens.__doc__ = """Bool [b, n]: generated tokens that `latent_phase_processor` (with `vocab_mask`) left as the
only choice (`</latent>` at the latent cap; under the grammar also the opening `<latent>`). The grammar,
not the policy, chose them, so RL masks them out of the policy gradient. Positions >= lengths are False."""
