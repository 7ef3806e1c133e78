"""The decode maths and the jitted bodies the `Sampler` (sampling.py) compiles: temperature, top-k and
top-p sampling from logits, log-probs, the prefill, the `lax.while_loop` decode over a KV cache, and
teacher-forced scoring. Pure functions of `(graphdef [static], state, arrays)`; the host-side driver,
shapes, shardings and compile options live in sampling.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.models.attention import target_platform

# `logits_processor(logits [B, V] fp32, tokens [B, N] int32, step int32 scalar) -> logits [B, V]`,
# or, when `generate(..., processor_aux=aux)` is given, `logits_processor(logits, tokens, step, aux)`
# with `aux` any pytree of arrays (traced, replicated: e.g. the latent budget n, or a per-row [B]
# budget), so changing its values does not recompile. `logits` arrive with `vocab_mask` applied;
# `tokens` holds the ids generated so far (columns >= step are pad). Must be jittable and pure; it
# is a static argument, so pass the *same* function object every call (a fresh lambda per call
# recompiles). Use it to ban tokens (set -inf) or force one (everything else -inf).
LogitsProcessor = Callable[..., jax.Array]


class DecodeConfig(NamedTuple):
    """Static (hashable) decode settings; a change compiles a new decode variant."""

    max_new_tokens: int
    greedy: bool
    top_k: int
    use_top_p: bool
    processor: LogitsProcessor | None
    has_vocab_mask: bool
    # The model's layer weights sliced once before the loop (`layer_slices`) instead of a scan over the
    # stacked layers every token: see `transformer.run_layers`.
    unstack_layers: bool = False


# ----------------------------------------------------------------------------------------------
# Pure sampling maths (fp32).


def mask_vocab(logits: Float[Array, "b v"], vocab_mask: Bool[Array, " v"] | None) -> Float[Array, "b v"]:
    logits = logits.astype(jnp.float32)
    return logits if vocab_mask is None else jnp.where(vocab_mask, logits, -jnp.inf)


def sample_logits(
    logits: Float[Array, "b v"],
    key: jax.Array,
    temperature: Float[Array, ""],
    top_p: Float[Array, ""],
    *,
    greedy: bool,
    top_k: int = 0,
    use_top_p: bool = False,
) -> Int[Array, " b"]:
    """Greedy argmax, or temperature -> top-k -> top-p (nucleus) filtered categorical sampling.

    Nucleus keeps the smallest prefix of the sorted distribution whose mass reaches `top_p`
    (always at least the most likely token).
    """
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits.astype(jnp.float32) / temperature
    idx = None
    if top_k > 0:
        vals, idx = jax.lax.top_k(scaled, min(top_k, scaled.shape[-1]))  # sorted, descending
    elif use_top_p:
        idx = jnp.argsort(-scaled, axis=-1, stable=True)
        vals = jnp.take_along_axis(scaled, idx, axis=-1)
    else:
        vals = scaled
    if use_top_p:
        probs = jax.nn.softmax(vals, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = (mass_before < top_p).at[:, 0].set(True)
        vals = jnp.where(keep, vals, -jnp.inf)
    choice = jax.random.categorical(key, vals, axis=-1)
    if idx is not None:
        choice = jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0]
    return choice.astype(jnp.int32)


def token_logprobs(
    logits: Float[Array, "b t v"],
    targets: Int[Array, "b t"],
    temperature: float | jax.Array = 1.0,
    vocab_mask: Bool[Array, " v"] | None = None,
) -> Float[Array, "b t"]:
    """`log_softmax(logits / T)[target]` per position, in fp32 (T <= 0 means T = 1, i.e. greedy)."""
    logits = logits.astype(jnp.float32)
    if vocab_mask is not None:
        logits = jnp.where(vocab_mask, logits, -jnp.inf)
    t = jnp.asarray(temperature, jnp.float32)
    logits = logits / jnp.where(t > 0, t, 1.0)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def sequence_logprobs(
    model: Any,
    tokens: Int[Array, "b t"],
    mask: Int[Array, "b t"],
    *,
    temperature: float | jax.Array = 1.0,
    vocab_mask: Bool[Array, " v"] | None = None,
) -> Float[Array, "b t"]:
    """Teacher-forced log-probs (differentiable). `mask` marks real tokens (1), which must be
    contiguous per row (left and right padding allowed). Output [B, T] is aligned with `tokens`:
    entry t is log p(tokens[t] | real tokens before t); 0 where t or t-1 is not real."""
    mask = mask.astype(jnp.int32)
    # Over sequence chunks (models/vocab_chunks.py): no [b, t, vocab] fp32 logits at scale.
    from dlr_jax.models.vocab_chunks import next_token_stats

    t = jnp.asarray(temperature, jnp.float32)
    lp = next_token_stats(model, tokens, {"attention_mask": mask}, vocab_mask=vocab_mask,
                          temperature=jnp.where(t > 0, t, 1.0)).logp
    ok = (mask[:, 1:] > 0) & (mask[:, :-1] > 0)
    lp = jnp.where(ok, lp, 0.0)
    return jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)


# ----------------------------------------------------------------------------------------------
# Jitted bodies. `graphdef` and the config tuples are static; everything else is a pytree.


def prefill(
    graphdef: nnx.GraphDef, cache_cfg: tuple[int, str | None, bool], state: nnx.State,
    ids: Int[Array, "b p"], positions: Int[Array, "b p"], token_mask: Bool[Array, "b p"],
) -> tuple[Float[Array, "b v"], Any]:
    model = nnx.merge(graphdef, state)
    cache_len, cache_dtype, unstack = cache_cfg
    b = ids.shape[0]
    # Only pass a dtype when asked: a model's init_cache need not take one.
    cache = model.init_cache(b, cache_len, *(() if cache_dtype is None else (cache_dtype,)))
    # Per-layer weights (sliced once here and once in the decode call) and per-layer cache buffers from
    # the start: the decode loop then reads both where they lie (`transformer.run_layers`).
    layers = {"layers": model.layer_slices()} if unstack else {}
    if all(hasattr(model, n) for n in ("embed_tokens", "trunk_cached", "logits_from_hidden")):
        # Project only the last position: [B, P, V] fp32 logits of a long prompt can be huge.
        h, cache = model.trunk_cached(model.embed_tokens(ids), positions, token_mask, cache, **layers)
        logits = model.logits_from_hidden(h[:, -1:])
    else:
        logits, cache = model.forward_cached(ids, positions, token_mask, cache, **layers)
        logits = logits[:, -1:]
    return logits[:, 0].astype(jnp.float32), cache


def decode_loop(
    graphdef: nnx.GraphDef, cfg: DecodeConfig, state: nnx.State, cache: Any,
    logits0: Float[Array, "b v"], prompt_lens: Int[Array, " b"], stop_ids: Int[Array, " s"],
    vocab_mask: Bool[Array, " v"] | None, pad_id: Int[Array, ""], temperature: Float[Array, ""],
    top_p: Float[Array, ""], rng: jax.Array, aux: Any,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, Any]:
    """The decode `lax.while_loop` after the prefill: one token per step from `logits0` on, until every
    row has stopped or `cfg.max_new_tokens`; (tokens, logprobs, lengths, finished, final cache)."""
    # The final cache is returned so the donated input buffer is reused in place by the loop
    # (without an aliasing output XLA copies the whole cache into the loop carry).
    model = nnx.merge(graphdef, state)
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):  # raw key data (multi-process callers)
        rng = jax.random.wrap_key_data(rng)
    b, n = logits0.shape[0], cfg.max_new_tokens
    lp_temp = jnp.float32(1.0) if cfg.greedy else temperature

    def choose(logits, tokens, step):
        logits = mask_vocab(logits, vocab_mask)
        logp_all = jax.nn.log_softmax(logits / lp_temp, axis=-1)
        if cfg.processor is None:
            shaped = logits
        else:
            extra = () if aux is None else (aux,)
            shaped = cfg.processor(logits, tokens, step, *extra).astype(jnp.float32)
        tok = sample_logits(shaped, jax.random.fold_in(rng, step), temperature, top_p,
                            greedy=cfg.greedy, top_k=cfg.top_k, use_top_p=cfg.use_top_p)
        return tok, jnp.take_along_axis(logp_all, tok[:, None], axis=-1)[:, 0]

    def record(carry, tok, lp):
        step, cache, tokens, logps, lengths, finished = carry
        tok = jnp.where(finished, pad_id, tok)
        lp = jnp.where(finished, 0.0, lp)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, tok, step, 1)
        logps = jax.lax.dynamic_update_index_in_dim(logps, lp, step, 1)
        lengths = lengths + (~finished).astype(jnp.int32)
        finished = finished | jnp.isin(tok, stop_ids)
        return (step + 1, cache, tokens, logps, lengths, finished)

    tokens = jnp.full((b, n), pad_id, jnp.int32)
    carry = (jnp.int32(0), cache, tokens, jnp.zeros((b, n), jnp.float32),
             jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool))
    carry = record(carry, *choose(logits0, tokens, jnp.int32(0)))

    def cond(carry):
        step, *_, finished = carry
        return (step < n) & ~jnp.all(finished)

    # On CPU the projections go out-major (`attention.OutMajor`): the layout XLA:CPU streams fastest
    # for a decode step's few rows.
    out_major = target_platform() == "cpu"
    layers = {"layers": model.layer_slices(out_major=out_major)} if cfg.unstack_layers else {}

    def body(carry):
        step, cache, tokens, _, _, finished = carry
        prev = jax.lax.dynamic_index_in_dim(tokens, step - 1, 1, keepdims=True)
        pos = (prompt_lens + step - 1)[:, None]
        logits, cache = model.forward_cached(prev, pos, ~finished[:, None], cache, **layers)
        carry = (step, cache, *carry[2:])
        return record(carry, *choose(logits[:, -1], tokens, step))

    _, cache, tokens, logps, lengths, finished = jax.lax.while_loop(cond, body, carry)
    return tokens, logps, lengths, finished, cache


def score_body(graphdef, state, tokens, mask, vocab_mask, temperature):
    return sequence_logprobs(nnx.merge(graphdef, state), tokens, mask, temperature=temperature,
                             vocab_mask=vocab_mask)


def score_states_body(graphdef, states, tokens, mask, vocab_mask, temperature):
    # One program for every state (e.g. old policy and reference): one dispatch and one transfer
    # back, and XLA schedules the passes together.
    return tuple(score_body(graphdef, st, tokens, mask, vocab_mask, temperature) for st in states)
