"""Vocabulary-sized work in sequence chunks: per-token log-probs (and argmax hits, entropies) of the
targets without a `[batch, seq, vocab]` fp32 logits tensor.

With a 128k-152k vocabulary plus 10k latent rows, the logits of one micro-batch, their softmax and
their gradient are most of a training step's temporaries (issue 19: ~10 of 16 GB for llama3.1-8b).
Here the final hidden states are cut into chunks of positions; each chunk's logits are computed
(`model.logits_from_hidden`: compute-dtype matmul, fp32 accumulation), reduced to the few numbers
per token the losses need, and dropped. The chunk body is rematerialised (`jax.checkpoint`), so the
backward pass recomputes one chunk's logits at a time instead of saving all of them. The maths is
the unchunked `log_softmax(logits / T)[target]`: gradients agree within fp32 rounding
(tests/models/test_vocab_chunks.py).

`chunk=None` picks the chunk from `LOGITS_BUDGET`; when the whole sequence fits, no loop is built
(XLA:CPU runs straight-line code faster than the same code in a while loop), so tiny configs compile
as before.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

# fp32 logits elements (global, before sharding) one chunk may hold: 2**27 = 512 MiB.
LOGITS_BUDGET = 2**27


class TokenStats(NamedTuple):
    logp: Float[Array, "b t"]  # log_softmax(masked logits / T)[target]
    correct: Float[Array, "b t"]  # 1.0 where the target's logit is the largest (ties count)
    entropy: Float[Array, "b t"] | None  # of softmax(masked logits / T); no gradient


def chunk_len(batch: int, seq: int, vocab: int, budget: int = LOGITS_BUDGET) -> int:
    """Positions per chunk so that batch x chunk x vocab fp32 logits stay within `budget`."""
    return max(1, min(seq, budget // max(batch * vocab, 1)))


def _stats(model: Any, h: jax.Array, targets: jax.Array, vocab_mask: Any, fill: float, temperature: Any,
           entropy: bool) -> tuple[jax.Array, ...]:
    logits = model.logits_from_hidden(h).astype(jnp.float32)
    if vocab_mask is not None:
        logits = jnp.where(vocab_mask[: logits.shape[-1]], logits, fill)
    logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    # a hit: the target's logit is the largest. Not argmax == target: XLA:CPU runs argmax as a (value, index)
    # reduce over the vocabulary, one more pass over the logits, where a max is shared with the logsumexp;
    # they differ only on exact ties, which this counts as hits (a -inf, i.e. masked, target never is).
    out = (tgt - lse, (jnp.isfinite(tgt) & (tgt >= jnp.max(logits, axis=-1))).astype(jnp.float32))
    if entropy:  # reported only: no gradient (and none of 0 * -inf on masked rows)
        la = jax.lax.stop_gradient(logits - lse[..., None])
        out += (-jnp.sum(jnp.where(jnp.isfinite(la), jnp.exp(la) * la, 0.0), axis=-1),)
    return out


def token_stats(
    model: Any,
    h: Float[Array, "b t d"],
    targets: Int[Array, "b t"],
    *,
    vocab_mask: Bool[Array, " v"] | None = None,
    fill: float = -jnp.inf,
    temperature: float | jax.Array = 1.0,
    entropy: bool = False,
    chunk: int | None = None,
    vocab_size: int | None = None,
) -> TokenStats:
    """Per-position statistics of `targets` under `model.logits_from_hidden(h)` (see module doc).

    vocab_mask: False rows get `fill` (-inf: never predicted; a large negative finite value keeps
    the log-probs finite on all-masked rows). chunk: positions per chunk (None: from LOGITS_BUDGET,
    which needs `vocab_size`, else one chunk)."""
    b, t, _ = h.shape
    vm = None if vocab_mask is None else jnp.asarray(vocab_mask, bool)
    temp = jnp.asarray(temperature, jnp.float32)
    vocab_size = vocab_size or (None if vm is None else vm.shape[0])
    if chunk is None:
        chunk = t if vocab_size is None else chunk_len(b, t, vocab_size)
    if chunk >= t:
        out = _stats(model, h, targets, vm, fill, temp, entropy)
        return TokenStats(out[0], out[1], out[2] if entropy else None)
    n = -(-t // chunk)
    pad = n * chunk - t
    hp = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    tp = jnp.pad(targets, ((0, 0), (0, pad)))
    hs = hp.reshape(b, n, chunk, -1).swapaxes(0, 1)  # [n, b, chunk, d]
    ts = tp.reshape(b, n, chunk).swapaxes(0, 1)

    @jax.checkpoint  # backward recomputes this chunk's logits; only h chunks are saved
    def one(xs):
        return _stats(model, xs[0], xs[1], vm, fill, temp, entropy)

    outs = jax.lax.map(one, (hs, ts))
    back = [o.swapaxes(0, 1).reshape(b, n * chunk)[:, :t] for o in outs]
    return TokenStats(back[0], back[1], back[2] if entropy else None)


class Precomputed:
    """Stands in for a model whose "hidden states" are already its logits."""

    def logits_from_hidden(self, h: jax.Array) -> jax.Array:
        return h


def next_token_stats(model: Any, tokens: Int[Array, "b t"], forward: dict[str, Any], **kwargs: Any) -> TokenStats:
    """`token_stats` of tokens[:, 1:] after tokens[:, :-1], the model called with `forward` keyword
    arguments: over chunks when it exposes `hidden_states` + `logits_from_hidden` (Transformer,
    LatentLM), else from its full logits (any `model(tokens, **forward) -> logits`)."""
    if hasattr(model, "hidden_states") and hasattr(model, "logits_from_hidden"):
        h = model.hidden_states(tokens, **forward)[:, :-1]
        return token_stats(model, h, tokens[:, 1:], **kwargs)
    logits = model(tokens, **forward)[:, :-1]
    return token_stats(Precomputed(), logits, tokens[:, 1:], **{**kwargs, "chunk": logits.shape[1]})
