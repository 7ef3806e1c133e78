"""Vocabulary-sized work in chunks: chunked per-token log-probs and their gradients equal the
written-out unchunked loss; no [batch, seq, vocab] fp32 buffer in the compiled chunked step (the
embedding lookup: tests/models/test_embedding.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.models.transformer import Transformer
from dlr_jax.models.vocab_chunks import chunk_len, token_stats

CFG = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                  head_dim=16)
B, T = 2, 21


def _data():
    rs = np.random.RandomState(0)
    toks = jnp.asarray(rs.randint(0, CFG.vocab_size, (B, T)), jnp.int32)
    mask = np.ones(CFG.vocab_size, bool)
    mask[-40:] = False  # padded rows, as the tokenizer's
    return toks, jnp.asarray(mask)


def _reference(params, graphdef, toks, vm, temperature):
    """The unchunked loss written out: full fp32 logits, log_softmax, gather."""
    model = nnx.merge(graphdef, params)
    logits = model(toks[:, :-1]).astype(jnp.float32)
    logits = jnp.where(vm, logits, -jnp.inf) / temperature
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), toks[:, 1:, None], -1)[..., 0]
    return lp


def _chunked(params, graphdef, toks, vm, temperature, chunk):
    model = nnx.merge(graphdef, params)
    h = model.hidden_states(toks[:, :-1])
    return token_stats(model, h, toks[:, 1:], vocab_mask=vm, temperature=temperature, entropy=True, chunk=chunk)


@pytest.mark.parametrize("chunk", [4, 7, None])  # 20 positions: ragged last chunk, and one chunk
def test_chunked_logprobs_and_gradients_equal_the_unchunked_loss(chunk):
    graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    toks, vm = _data()
    ref = _reference(params, graphdef, toks, vm, 0.7)
    got = _chunked(params, graphdef, toks, vm, 0.7, chunk)
    np.testing.assert_allclose(got.logp, ref, atol=1e-5)
    logits = jnp.where(vm, nnx.merge(graphdef, params)(toks[:, :-1]), -jnp.inf) / 0.7
    p = jax.nn.softmax(logits, -1)
    ent = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1)
    np.testing.assert_allclose(got.entropy, ent, atol=1e-4)
    np.testing.assert_array_equal(got.correct, (jnp.argmax(logits, -1) == toks[:, 1:]).astype(np.float32))

    w = jnp.asarray(np.random.RandomState(1).rand(B, T - 1), jnp.float32)  # a weighted token sum, like the losses
    g_ref = jax.grad(lambda q: jnp.sum(w * _reference(q, graphdef, toks, vm, 0.7)))(params)
    g_got = jax.grad(lambda q: jnp.sum(w * _chunked(q, graphdef, toks, vm, 0.7, chunk).logp))(params)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    assert any(float(jnp.abs(x).max()) > 1e-3 for x in jax.tree.leaves(g_ref))  # gradients are not ~0


def test_chunked_step_holds_no_full_vocab_logits():
    graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    toks, vm = _data()
    full = f"f32[{B},{T - 1},{CFG.vocab_size}]"

    def hlo(chunk):
        f = jax.grad(lambda q: jnp.sum(_chunked(q, graphdef, toks, vm, 1.0, chunk).logp))
        return jax.jit(f).lower(params).compile().as_text()

    assert full in hlo(None)  # the control: one chunk materialises [b, t, vocab] fp32
    chunked = hlo(5)
    assert full not in chunked and f"f32[{B},5,{CFG.vocab_size}]" in chunked


def test_chunk_len_fits_the_budget():
    assert chunk_len(32, 256, 1000) == 256  # tiny configs: one chunk, no loop
    c = chunk_len(64, 256, 138_000)  # llama3 vocab + latents
    assert 1 <= c < 256 and 64 * c * 138_000 <= 2**27


def test_a_hit_is_the_largest_finite_target_logit():
    """`correct` (token accuracy): the target's logit is the largest (ties count, where argmax picks the first);
    a masked (-inf) target is never a hit, not even on a row whose every logit is masked."""
    from dlr_jax.models.vocab_chunks import Precomputed

    logits = jnp.asarray([[[1.0, 3.0, 3.0, 0.0], [2.0, 1.0, 0.0, 0.0], [-jnp.inf] * 4, [0.0, 5.0, 1.0, 2.0]]])
    targets = jnp.asarray([[2, 0, 1, 3]])  # a tie at the max; the max; an all-masked row; not the max
    got = token_stats(Precomputed(), logits, targets)
    np.testing.assert_array_equal(got.correct, [[1.0, 1.0, 0.0, 0.0]])
