"""decoding.py's sampling maths against written-out references: greedy, top-k, nucleus (top-p) support,
and temperature-scaled, vocab-masked log-probs. The prefill and decode loop are tested through the
`Sampler` (tests/generate/test_sampler.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dlr_jax.generate.decoding import mask_vocab, sample_logits, token_logprobs

PROBS = np.array([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]], np.float32)
LOGITS = jnp.log(jnp.asarray(PROBS))


def _draws(n: int = 200, top_p: float = 1.0, **kw) -> np.ndarray:
    keys = jax.random.split(jax.random.key(0), n)
    draw = jax.vmap(lambda k: sample_logits(LOGITS, k, jnp.float32(1.0), jnp.float32(top_p), greedy=False, **kw))
    return np.asarray(draw(keys))  # [n, 2]


def test_greedy_and_top1_are_the_argmax():
    key = jax.random.key(3)
    greedy = sample_logits(LOGITS, key, jnp.float32(1.0), jnp.float32(1.0), greedy=True)
    np.testing.assert_array_equal(np.asarray(greedy), [0, 3])
    assert set(map(tuple, _draws(50, top_k=1))) == {(0, 3)}


def test_nucleus_keeps_the_smallest_prefix_reaching_top_p():
    # Mass before each sorted token: 0, 0.5, 0.8, 0.95. top_p = 0.7 keeps the first two (0 < 0.7, 0.5 < 0.7).
    draws = _draws(400, top_p=0.7, use_top_p=True)
    assert set(draws[:, 0]) == {0, 1} and set(draws[:, 1]) == {3, 2}
    # top_p near 0 still keeps the most likely token.
    assert set(map(tuple, _draws(50, top_p=1e-6, use_top_p=True))) == {(0, 3)}
    # Unfiltered sampling reaches every token.
    assert set(_draws(400)[:, 0]) == {0, 1, 2, 3}


def test_token_logprobs_match_a_written_out_log_softmax():
    logits = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 5)), jnp.float32)
    targets = jnp.asarray([[0, 2, 4], [1, 1, 3]], jnp.int32)
    mask = jnp.asarray([True, True, False, True, True])
    got = np.asarray(token_logprobs(logits, targets, temperature=0.5, vocab_mask=mask))
    z = np.where(np.asarray(mask), np.asarray(logits) / 0.5, -np.inf)
    ref = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
    want = np.take_along_axis(ref, np.asarray(targets)[..., None], -1)[..., 0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    # T <= 0 means greedy: log-probs at T = 1.
    np.testing.assert_allclose(np.asarray(token_logprobs(logits, targets, temperature=0.0)),
                               np.asarray(token_logprobs(logits, targets, temperature=1.0)))
    assert np.isneginf(np.asarray(mask_vocab(logits[:, 0], mask))[:, 2]).all()
