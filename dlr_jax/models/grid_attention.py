"""Self-attention over an h x w grid with SAM's decomposed relative-position bias, with the queries in
chunks of grid rows where the whole [b, heads, h*w, h*w] scores would be too large.

Why chunks: a global block of the from-scratch codebook's encoder at the paper's 1024 px attends over
4096 tokens, and its whole fp32 scores and bias ([b, 12, 4096, 4096]: 6 GiB a device for 8 images) were
the largest values of the codebook stage's deviceless plans. Each chunk holds its rows' scores only and
is rematerialised in the backward pass. Every query row still attends over every key, so the result is
the unchunked one up to the matmuls' summation order. The chunks read fp32 copies of k and v: the
backward pass sums their gradients over the chunks in the dtype of what the chunks read, and 64 bf16
roundings of that sum would lose what one matmul's fp32 accumulation keeps. Small canvases stay under
the budget and run as one piece; windowed blocks (many small grids, the windows on the batch dim) never
chunk.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

# Scores (fp32 elements of the global batch: batch x heads x queries x keys) a chunk aims at; a chunk is
# never less than one grid row, so a large batch gets one-row chunks somewhat above it.
SCORES_BUDGET = 2**27


def query_rows(b: int, heads: int, h: int, w: int, budget: int = SCORES_BUDGET) -> int:
    """Grid rows of queries per chunk: the most that divide `h` and keep a chunk's scores within `budget`
    (at least one row; `h`: one piece)."""
    fit = max(1, budget // max(1, b * heads * w * h * w))
    return max(r for r in range(1, h + 1) if h % r == 0 and r <= fit)


def _attend(q, k, v, rh, rw):
    """`q` [b, r, w, n, c] (r of the grid's rows) over every key `k`, `v` [b, h*w, n, c], with the bias
    tables `rh` [r, h, c] (these rows) and `rw` [w, w, c]: [b, r*w, n, c]."""
    b, r, w, n, c = q.shape
    dt = q.dtype
    k, v = k.astype(dt), v.astype(dt)
    # The bias uses the unscaled query, as in SAM.
    bias_h = jnp.einsum("byxnc,ykc->bnyxk", q, rh.astype(dt), preferred_element_type=jnp.float32)
    bias_w = jnp.einsum("byxnc,xkc->bnyxk", q, rw.astype(dt), preferred_element_type=jnp.float32)
    bias = (bias_h[..., :, None] + bias_w[..., None, :]).reshape(b, n, r * w, -1)
    scores = jnp.einsum("bqnc,bsnc->bnqs", q.reshape(b, r * w, n, c), k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores / math.sqrt(c) + bias, axis=-1).astype(dt)
    return jnp.einsum("bnqs,bsnc->bqnc", probs, v)


def grid_attention(
    q: Float[Array, "b h w n c"], k: Float[Array, "b h w n c"], v: Float[Array, "b h w n c"],
    rh: Float[Array, "h h c"], rw: Float[Array, "w w c"], scores_budget: int | None = SCORES_BUDGET,
) -> Float[Array, "b h w n c"]:
    """softmax(q k^T / sqrt(c) + rel-pos bias) v over the whole grid; `rh`, `rw`: the relative-position
    tables resized to the grid ([query row, key row, c] and [query col, key col, c]). `scores_budget`:
    global scores elements a chunk may hold (None: one piece)."""
    b, h, w, n, c = q.shape
    kf, vf = k.reshape(b, h * w, n, c), v.reshape(b, h * w, n, c)
    rows = h if scores_budget is None else query_rows(b, n, h, w, scores_budget)
    if rows == h:
        return _attend(q, kf, vf, rh, rw).reshape(b, h, w, n, c)
    chunks = h // rows
    qs = q.reshape(b, chunks, rows, w, n, c).swapaxes(0, 1)
    k32, v32 = kf.astype(jnp.float32), vf.astype(jnp.float32)
    part = jax.checkpoint(lambda xs: _attend(xs[0], k32, v32, xs[1], rw), prevent_cse=False)
    out = jax.lax.map(part, (qs, rh.reshape(chunks, rows, h, c)))  # [chunks, b, rows * w, n, c]
    return out.swapaxes(0, 1).reshape(b, h, w, n, c)
