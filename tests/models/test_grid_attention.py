"""Grid attention in chunks of query rows: equal to the whole attention (values and gradients), the
chunk size from the budget, and a step's temporaries cut by the chunking."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.models.grid_attention import grid_attention, query_rows

B, H, W, N, C = 2, 8, 6, 2, 8


def _inputs(h=H, w=W, seed=0):
    rs = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rs.standard_normal((B, h, w, N, C)), jnp.float32) for _ in range(3))
    rh = jnp.asarray(0.3 * rs.standard_normal((h, h, C)), jnp.float32)
    rw = jnp.asarray(0.3 * rs.standard_normal((w, w, C)), jnp.float32)
    return q, k, v, rh, rw


def _by_hand(q, k, v, rh, rw):
    """The attention written out in numpy (float64): SAM's bias q . rh[y_q, y_k] + q . rw[x_q, x_k]."""
    q, k, v, rh, rw = (np.asarray(a, np.float64) for a in (q, k, v, rh, rw))
    b, h, w, n, c = q.shape
    bias = np.einsum("byxnc,ykc->bnyxk", q, rh)[..., :, None] + np.einsum("byxnc,xkc->bnyxk", q, rw)[..., None, :]
    scores = np.einsum("byxnc,bjinc->bnyxji", q, k) / np.sqrt(c) + bias
    scores = scores.reshape(b, n, h * w, h * w)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bnqs,bsnc->bqnc", p, v.reshape(b, h * w, n, c))
    return out.reshape(b, h, w, n, c)


@pytest.mark.parametrize("rows", [1, 2, 4, H])
def test_chunks_of_query_rows_equal_the_attention_written_out(rows):
    args = _inputs()
    budget = rows * B * N * W * H * W  # exactly `rows` grid rows of queries per chunk
    assert query_rows(B, N, H, W, budget) == rows
    out = jax.jit(lambda *a: grid_attention(*a, scores_budget=budget))(*args)
    np.testing.assert_allclose(out, _by_hand(*args), rtol=1e-5, atol=1e-5)


def test_chunked_gradients_equal_the_whole_ones():
    args = _inputs(seed=1)
    w = jnp.asarray(np.random.default_rng(2).standard_normal((B, H, W, N, C)), jnp.float32)

    def grads(budget):
        loss = lambda *a: (grid_attention(*a, scores_budget=budget) * w).sum()  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args)

    for whole, chunked in zip(grads(None), grads(B * N * W * H * W), strict=True):
        np.testing.assert_allclose(chunked, whole, rtol=1e-4, atol=1e-5)


def test_query_rows_takes_the_most_rows_that_divide_the_grid_and_fit():
    per_row = B * N * W * H * W
    assert query_rows(B, N, H, W, 10**12) == H  # one piece
    assert query_rows(B, N, H, W, 3 * per_row) == 2  # 3 rows fit, 2 divide 8
    assert query_rows(B, N, H, W, 1) == 1  # never less than a row
    assert query_rows(B, N, 7, W, 6 * B * N * W * 7 * W) == 1  # 7 rows: only 1 and 7 divide


def test_chunks_cut_the_temporaries_of_a_training_step():
    """Forward and backward of a 32 x 32 grid: the whole attention holds [b, n, 1024, 1024] fp32 scores,
    bias and probabilities; in chunks of 2 rows only a chunk's."""
    args = _inputs(32, 32, seed=3)

    def temp_bytes(budget):
        loss = lambda *a: grid_attention(*a, scores_budget=budget).sum()  # noqa: E731
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    whole, chunked = temp_bytes(None), temp_bytes(2 * B * N * 32 * 32 * 32)
    assert whole > 4 * B * N * 1024 * 1024  # at least one whole scores buffer
    assert chunked < whole / 4, (chunked, whole)


def test_bf16_chunks_keep_the_whole_attentions_dtypes_and_gradient_error():
    """In bf16 the chunked path returns bf16 like the whole one, and its k and v gradients, summed over
    64 one-row chunks (a 1024-px canvas's global block), are as close to the fp32 ones as the whole
    attention's. Summed in bf16 instead, their error was about 3x the whole attention's."""
    args32 = _inputs(64, 8, seed=4)
    args16 = tuple(a.astype(jnp.bfloat16) if i < 3 else a for i, a in enumerate(args32))

    def grads(args, budget):
        loss = lambda *a: grid_attention(*a, scores_budget=budget).astype(jnp.float32).sum()  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(1, 2)))(*args)

    ref = grads(args32, None)
    assert jax.jit(lambda *a: grid_attention(*a, scores_budget=1))(*args16).dtype == jnp.bfloat16

    def errors(budget):
        gs = grads(args16, budget)
        assert all(g.dtype == jnp.bfloat16 for g in gs)
        return [float(jnp.abs(g.astype(jnp.float32) - r).max() / jnp.abs(r).max())
                for g, r in zip(gs, ref, strict=True)]

    for chunked, whole in zip(errors(1), errors(None), strict=True):
        assert chunked <= 1.2 * whole + 1e-4, (chunked, whole)
