"""Stochastic vector quantisation of reasoning features onto a codebook.

Every query-side feature h_i (plus N(0, sigma^2 I) noise while training) is snapped to its nearest
codebook row; the straight-through estimator passes the decoder's gradient back to h unchanged:

    ids     = argmin_k ||h~ - c_k||^2,   h~ = h + sigma * eps
    h_st    = h + sg(c_ids - h)                      (value c_ids, d h_st / d h = I)
    vq      = mean ||sg(h) - c_ids||^2               (moves the codebook only)
    commit  = mean ||h - sg(c_ids)||^2               (moves the encoder only)
    loss    = lam * (vq + beta * commit),  lam = 0.25, beta = 0.1  (`vq_objective`)

Noise enters only the nearest-code search. h_st's value is the code either way and its gradient
w.r.t. h is the identity either way, so adding the noise there would change nothing; the two losses
use the clean h because E_eps[grad ||h + eps - c||^2] equals grad ||h - c||^2 -- same expected
update, less variance. "mean" is over valid positions *and* the d feature dims (per-element MSE).

Distances are ||h||^2 - 2 h.c + ||c||^2 from one [M, K] matmul (never an [M, K, d] tensor); the
row constant ||h||^2 is left out of the argmin, which changes no choice and avoids float32 rounding
of a large common term. Everything here is jit-able and works with the codebook sharded over its
`codes` axis (GSPMD splits the matmul and the argmin/gather reductions).

Also here: k-means++ / Lloyd warm start streaming over feature batches, usage statistics, an EMA
usage tracker (a plain pytree) and dead-code refresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

_HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------------- quantize
def squared_distances(h: Array, codebook: Array, *, precision: Any = _HIGHEST) -> Array:
    """||h_m - c_k||^2 for h [M, d], codebook [K, d] -> [M, K] float32 (full formula)."""
    h = h.astype(jnp.float32)
    c = codebook.astype(jnp.float32)
    cross = jnp.einsum("md,kd->mk", h, c, precision=precision)
    return jnp.sum(h * h, -1, keepdims=True) - 2.0 * cross + jnp.sum(c * c, -1)[None, :]


def _argmin_codes(h2: Array, codebook: Array, precision: Any) -> Array:
    """h2 [M, d] -> ids [M] int32; drops the per-row ||h||^2 (same argmin)."""
    c = codebook.astype(jnp.float32)
    cross = jnp.einsum("md,kd->mk", h2.astype(jnp.float32), c, precision=precision)
    return jnp.argmin(jnp.sum(c * c, -1)[None, :] - 2.0 * cross, axis=-1).astype(jnp.int32)


def nearest_codes(h: Array, codebook: Array, *, precision: Any = _HIGHEST) -> Array:
    """h [..., d], codebook [K, d] -> ids [...] int32 of the nearest row (no noise; for export)."""
    lead = h.shape[:-1]
    return _argmin_codes(h.reshape(-1, h.shape[-1]), codebook, precision).reshape(lead)


def _masked_mean_sq(diff: Array, mask: Array | None) -> Array:
    """Mean of diff^2 over valid positions and the feature dim; 0 when nothing is valid."""
    sq = jnp.sum(jnp.square(diff.astype(jnp.float32)), axis=-1)  # [...]
    d = diff.shape[-1]
    if mask is None:
        return jnp.mean(sq) / d
    m = mask.astype(jnp.float32)
    return jnp.sum(sq * m) / (jnp.maximum(jnp.sum(m), 1.0) * d)


def quantize(
    h: Array,
    codebook: Array,
    *,
    rng: Array | None = None,
    sigma: float | Array = 0.0,
    mask: Array | None = None,
    precision: Any = _HIGHEST,
) -> tuple[Array, Array, Array, Array]:
    """Stochastic nearest-code quantisation with a straight-through estimator.

    Args:
      h: [..., d] features (any float dtype); codebook: [K, d].
      rng: PRNG key for the search noise; no noise when None.
      sigma: noise std; a Python 0 skips the noise, a traced value is always applied (0 -> exact h).
      mask: [...] bool/0-1, valid positions; losses average over them only. Padded positions still
        get (meaningless but in-range) ids and h_st.
    Returns:
      ids [...] int32, h_st [..., d] (h's dtype; value = codebook[ids]), vq_loss, commit_loss
      (float32 scalars, mean squared error per element; see the module docstring).
    """
    chex.assert_type([h, codebook], [float, float])  # integer features would quantize silently wrong
    if codebook.ndim != 2:
        raise ValueError(f"quantize: codebook must be [K, d], got shape {codebook.shape}")
    if h.shape[-1] != codebook.shape[-1]:
        raise ValueError(f"quantize: feature dim {h.shape[-1]} != codebook dim {codebook.shape[-1]}")
    if mask is not None and mask.shape != h.shape[:-1]:
        raise ValueError(f"quantize: mask shape {mask.shape} must equal h.shape[:-1] = {h.shape[:-1]}")
    noisy = h
    if rng is not None and not (isinstance(sigma, int | float) and sigma == 0):
        noise = jax.random.normal(rng, h.shape, jnp.float32)
        noisy = h.astype(jnp.float32) + jnp.asarray(sigma, jnp.float32) * noise
    ids = nearest_codes(noisy, codebook, precision=precision)
    codes = jnp.take(codebook, ids, axis=0)  # [..., d]
    h_st = h + jax.lax.stop_gradient(codes.astype(h.dtype) - h)
    vq_loss = _masked_mean_sq(jax.lax.stop_gradient(h).astype(jnp.float32) - codes, mask)
    commit_loss = _masked_mean_sq(h.astype(jnp.float32) - jax.lax.stop_gradient(codes), mask)
    return ids, h_st, vq_loss, commit_loss


def vq_objective(vq_loss: Array, commit_loss: Array, lam: float = 0.25, beta: float = 0.1) -> Array:
    """The paper's VQ term: lam * (vq_loss + beta * commit_loss)."""
    return lam * (vq_loss + beta * commit_loss)


class VectorQuantizer(nnx.Module):
    """The codebook as an `nnx.Param` [K, d] with logical axes ("codes", "latent_dim").

    Random init N(0, init_std^2) is a placeholder; the codebook stage overwrites it with
    `kmeans_init` on encoder features.
    """

    def __init__(
        self,
        num_codes: int = 10_000,
        dim: int = 896,
        *,
        sigma: float = 0.0,
        init_std: float = 1.0,
        dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.num_codes, self.dim, self.sigma = num_codes, dim, sigma
        value = init_std * jax.random.normal(rngs.params(), (num_codes, dim), dtype)
        self.codebook = nnx.Param(value, logical_axes=("codes", "latent_dim"))

    def __call__(
        self,
        h: Array,
        *,
        rng: Array | None = None,
        mask: Array | None = None,
        sigma: float | Array | None = None,
    ) -> tuple[Array, Array, Array, Array]:
        """`quantize(h, codebook, ...)`; `sigma` overrides the module's training noise std."""
        return quantize(
            h, self.codebook[...], rng=rng, sigma=self.sigma if sigma is None else sigma, mask=mask
        )


# ----------------------------------------------------------------------------- usage statistics
def code_usage(ids: Array, num_codes: int, mask: Array | None = None) -> tuple[Array, Array, Array]:
    """ids [...] -> (counts [K] int32, used: int32 scalar, perplexity: float32 scalar).

    Perplexity is exp(entropy) of the usage distribution: K when all codes are used equally, 1 when
    one code takes everything (0 positions -> 1). Scalars are arrays so this works under jit;
    `int(used)`, `float(perplexity)` outside.
    """
    w = None if mask is None else mask.reshape(-1).astype(jnp.int32)
    counts = jnp.bincount(ids.reshape(-1), weights=w, length=num_codes).astype(jnp.int32)
    used = jnp.sum(counts > 0).astype(jnp.int32)
    p = counts.astype(jnp.float32) / jnp.maximum(jnp.sum(counts), 1).astype(jnp.float32)
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
    return counts, used, jnp.exp(entropy)


class UsageEMA(NamedTuple):
    """EMA of per-step code counts; a pytree (checkpoint it with the train state)."""

    counts: Array  # [K] float32, biased EMA
    step: Array  # int32 scalar: updates so far (for bias correction)


def usage_ema_init(num_codes: int) -> UsageEMA:
    return UsageEMA(jnp.zeros((num_codes,), jnp.float32), jnp.zeros((), jnp.int32))


def usage_ema_update(state: UsageEMA, ids: Array, mask: Array | None = None, decay: float = 0.99) -> UsageEMA:
    counts, _, _ = code_usage(ids, state.counts.shape[0], mask)
    new = decay * state.counts + (1.0 - decay) * counts.astype(jnp.float32)
    return UsageEMA(new, state.step + 1)


def usage_ema_value(state: UsageEMA, decay: float = 0.99) -> Array:
    """Bias-corrected EMA counts per step [K] (as Adam corrects its moments)."""
    corr = 1.0 - jnp.power(jnp.float32(decay), jnp.maximum(state.step, 1).astype(jnp.float32))
    return state.counts / corr


def usage_ema_reset(state: UsageEMA, codes: Array, value: float | Array, decay: float = 0.99) -> UsageEMA:
    """Sets the bias-corrected EMA of the codes selected by the bool mask `codes` [K] to `value`
    (e.g. after `refresh_dead_codes`, so a fresh code gets time before it can die again)."""
    corr = 1.0 - jnp.power(jnp.float32(decay), jnp.maximum(state.step, 1).astype(jnp.float32))
    return UsageEMA(jnp.where(codes, jnp.asarray(value, jnp.float32) * corr, state.counts), state.step)


def refresh_dead_codes(
    codebook: Array,
    usage_ema: Array | UsageEMA,
    recent_features: Array,
    rng: Array,
    threshold: float,
    *,
    noise_scale: float = 0.01,
    pick: str = "random",
) -> tuple[Array, Array]:
    """Replaces codes whose EMA usage is below `threshold` with recent features plus small noise.

    `pick`: which features the dead codes take. "random": a random order of the features. "farthest": the
    features farthest from their nearest live code first, so a dead code lands where the live codes quantize
    worst (two inputs that share a code: the features of the one the code sits farther from) instead of
    mostly on the frequent inputs, which live codes already hold.

    Args:
      codebook [K, d]; usage_ema [K] (or a `UsageEMA`, bias-corrected here); recent_features
      [M, d] (e.g. the last batch's h); noise std = noise_scale * per-dim std of the features.
    Returns:
      (new codebook [K, d], dead [K] bool). Distinct features are used while #dead <= M.
    """
    if pick not in ("random", "farthest"):
        raise ValueError(f"pick must be 'random' or 'farthest', got {pick!r}")
    usage = usage_ema_value(usage_ema) if isinstance(usage_ema, UsageEMA) else usage_ema
    feats = recent_features.reshape(-1, codebook.shape[-1]).astype(jnp.float32)
    m = feats.shape[0]
    dead = usage < threshold
    k_perm, k_noise = jax.random.split(rng)
    if pick == "random":
        perm = jax.random.permutation(k_perm, m)
    else:  # distance to the nearest live code, largest first (ties: the feature order)
        d2 = jnp.where(dead[None, :], jnp.inf, squared_distances(feats, codebook.astype(jnp.float32)))
        perm = jnp.argsort(-jnp.min(d2, axis=-1), stable=True)
    rank = jnp.cumsum(dead.astype(jnp.int32)) - 1  # the r-th dead code takes the r-th feature
    picked = feats[perm[jnp.maximum(rank, 0) % m]]
    std = jnp.std(feats, axis=0)
    fresh = picked + noise_scale * std * jax.random.normal(k_noise, picked.shape, jnp.float32)
    return jnp.where(dead[:, None], fresh.astype(codebook.dtype), codebook), dead


# ------------------------------------------------------------------------------ k-means warm start
Features = Array | np.ndarray | Iterable[Array | np.ndarray] | Callable[[], Iterable[Array | np.ndarray]]


def _batch_source(features: Features, batch_size: int) -> Callable[[], Iterator[Any]]:
    """A zero-argument function giving a fresh iterator of [b, d] batches for every pass."""
    if hasattr(features, "shape") and hasattr(features, "ndim"):
        if features.ndim != 2:
            raise ValueError(f"kmeans_init: features must be [N, d], got shape {features.shape}")
        # slice before moving to the device: a big host array is never copied over whole
        return lambda: (features[i : i + batch_size] for i in range(0, features.shape[0], batch_size))
    if callable(features):
        return lambda: iter(features())
    if iter(features) is features:  # type: ignore[arg-type]
        raise TypeError(
            "kmeans_init: a one-shot iterator cannot be streamed once per Lloyd iteration; pass an "
            "array, a list of batches, or a callable returning a fresh iterator"
        )
    return lambda: iter(features)  # type: ignore[arg-type]


def _chunks(source: Callable[[], Iterator[Any]], batch_size: int, dim: int | None) -> Iterator[tuple]:
    """Re-chunks a stream into fixed [batch_size, d] float32 blocks + validity masks (one compile)."""
    for i, batch in enumerate(source()):
        x = jnp.asarray(batch, jnp.float32)
        if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
            raise ValueError(f"kmeans_init: batch {i} has shape {x.shape}, expected [b, {dim or 'd'}]")
        dim = x.shape[1]
        for s in range(0, x.shape[0], batch_size):
            part = x[s : s + batch_size]
            n = part.shape[0]
            if n < batch_size:
                part = jnp.pad(part, ((0, batch_size - n), (0, 0)))
            yield part, jnp.arange(batch_size) < n


@jax.jit
def _reservoir_merge(
    buf_keys: Array, buf_x: Array, key: Array, x: Array, valid: Array
) -> tuple[Array, Array]:
    """Keeps the points with the smallest uniform keys: a uniform sample without replacement."""
    keys = jnp.where(valid, jax.random.uniform(key, valid.shape), jnp.inf)
    all_keys = jnp.concatenate([buf_keys, keys])
    _, idx = jax.lax.top_k(-all_keys, buf_keys.shape[0])
    return all_keys[idx], jnp.concatenate([buf_x, x])[idx]


@jax.jit
def _kmeans_pp(key: Array, x: Array, valid: Array, centers0: Array) -> Array:
    """Greedy k-means++ seeding on the sample x [S, d] (rows with valid=False are never picked):
    each step draws 2 + log(k) D^2-weighted candidates and keeps the one that lowers the potential
    most, which avoids most of plain k-means++'s merged/split-cluster starts."""
    k = centers0.shape[0]
    n_cand = 2 + int(np.log(k))
    x2 = jnp.sum(x * x, -1)

    def d2_to(c: Array) -> Array:  # c [L, d] -> [L, S]
        d2 = x2[None] - 2.0 * jnp.einsum("ld,sd->ls", c, x, precision=_HIGHEST) + jnp.sum(c * c, -1)[:, None]
        return jnp.where(valid[None], jnp.maximum(d2, 0.0), 0.0)

    # Inverse-CDF draws from pre-drawn uniforms: no RNG inside the loop, which keeps compiles fast.
    u = jax.random.uniform(key, (k, n_cand))

    def draw(weights: Array, u_row: Array) -> Array:
        cum = jnp.cumsum(weights)
        return jnp.minimum(jnp.searchsorted(cum, u_row * cum[-1], side="right"), x.shape[0] - 1)

    first = draw(valid.astype(jnp.float32), u[0, :1])[0]
    centers = centers0.at[0].set(x[first])

    def body(i, carry):
        centers, mind2 = carry
        # D^2 sampling; if every valid point already is a center, fall back to uniform.
        weights = jnp.where(jnp.sum(mind2) > 0, mind2, valid.astype(jnp.float32))
        cand = draw(weights, u[i])
        new_min = jnp.minimum(mind2[None], d2_to(x[cand]))  # [L, S]
        best = jnp.argmin(jnp.sum(new_min, -1))
        return centers.at[i].set(x[cand[best]]), new_min[best]

    centers, _ = jax.lax.fori_loop(1, k, body, (centers, d2_to(x[first][None])[0]))
    return centers


@jax.jit
def _assign_accumulate(carry: tuple, x: Array, valid: Array, centers: Array) -> tuple[tuple, Array]:
    """One batch of a Lloyd pass: add per-cluster sums/counts, keep the farthest points; returns the
    batch's inertia separately (summed on the host in float64 so the history has no drift)."""
    sums, counts, far_d, far_x = carry
    d2 = squared_distances(x, centers)
    ids = jnp.argmin(d2, -1)
    mind = jnp.maximum(jnp.min(d2, -1), 0.0)
    w = valid.astype(jnp.float32)
    k = centers.shape[0]
    sums = sums + jax.ops.segment_sum(x * w[:, None], ids, num_segments=k)
    counts = counts + jax.ops.segment_sum(w, ids, num_segments=k)
    cand_d = jnp.concatenate([far_d, jnp.where(valid, mind, -jnp.inf)])
    cand_x = jnp.concatenate([far_x, x])
    far_d, idx = jax.lax.top_k(cand_d, far_d.shape[0])
    return (sums, counts, far_d, cand_x[idx]), jnp.sum(mind * w)


@jax.jit
def _lloyd_update(carry: tuple, centers: Array, sample: Array, sample_valid: Array, key: Array) -> Array:
    """Means of the assigned points; empty clusters move to the farthest points of the pass (then
    to random sample points). An empty cluster holds no point, so moving it cannot raise inertia."""
    sums, counts, far_d, far_x = carry
    means = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], centers)
    empty = counts == 0
    rank = jnp.cumsum(empty.astype(jnp.int32)) - 1
    n_far = far_d.shape[0]
    far_ok = (rank < n_far) & (far_d[jnp.clip(rank, 0, n_far - 1)] > -jnp.inf)
    # valid sample rows come first (the reservoir keeps its smallest keys in ascending order)
    rand = jax.random.randint(key, (centers.shape[0],), 0, jnp.maximum(jnp.sum(sample_valid), 1))
    reseed = jnp.where(far_ok[:, None], far_x[jnp.clip(rank, 0, n_far - 1)], sample[rand])
    return jnp.where(empty[:, None], reseed, means)


def kmeans_init(
    features: Features,
    k: int,
    *,
    rng: Array,
    iters: int = 10,
    batch_size: int = 4096,
    sample_size: int | None = None,
    tol: float = 0.0,
) -> tuple[Array, np.ndarray]:
    """k-means codebook warm start, streaming over feature batches.

    Args:
      features: [N, d] array, a re-iterable of [b, d] batches, or a callable returning a fresh
        iterator (one pass to sample, then one pass per Lloyd iteration).
      k: number of codes. rng: PRNG key. iters: Lloyd iterations.
      sample_size: points kept (uniformly at random over the whole stream) for k-means++ seeding;
        default max(4k, 1024).
      tol: stop early once an iteration lowers inertia by <= tol (relative); 0 runs all iterations.
    Returns:
      codebook [k, d] float32 and the inertia history (mean squared distance per point) as a NumPy
      array: entry 0 is the k-means++ seeds, entry i the centres after i updates, the last entry the
      returned codebook. Lloyd steps never increase it (up to float32 rounding).
    """
    if hasattr(features, "shape"):
        batch_size = max(1, min(batch_size, int(features.shape[0])))
    source = _batch_source(features, batch_size)
    s = sample_size or max(4 * k, 1024)

    key_sample, key_pp, key_loop = jax.random.split(rng, 3)
    buf_keys = buf_x = None
    dim = None
    for i, (x, valid) in enumerate(_chunks(source, batch_size, None)):
        if buf_x is None:
            dim = x.shape[1]
            buf_keys, buf_x = jnp.full((s,), jnp.inf, jnp.float32), jnp.zeros((s, dim), jnp.float32)
        buf_keys, buf_x = _reservoir_merge(buf_keys, buf_x, jax.random.fold_in(key_sample, i), x, valid)
    if buf_x is None:
        raise ValueError("kmeans_init: the feature stream is empty")
    sample_valid = jnp.isfinite(buf_keys)
    n_sample = int(jnp.sum(sample_valid))
    if n_sample < k:
        raise ValueError(f"kmeans_init: need at least k={k} feature vectors, got {n_sample}")
    centers = _kmeans_pp(key_pp, buf_x, sample_valid, jnp.zeros((k, dim), jnp.float32))

    n_far = min(k, batch_size, 1024)
    history: list[float] = []
    for it in range(iters + 1):
        carry = (
            jnp.zeros((k, dim), jnp.float32),
            jnp.zeros((k,), jnp.float32),
            jnp.full((n_far,), -jnp.inf, jnp.float32),
            jnp.zeros((n_far, dim), jnp.float32),
        )
        parts, n = [], []
        for x, valid in _chunks(source, batch_size, dim):
            carry, part = _assign_accumulate(carry, x, valid, centers)
            parts.append(part)
            n.append(jnp.sum(valid))
        history.append(float(np.sum(np.asarray(parts, np.float64)) / max(float(np.sum(n)), 1.0)))
        converged = tol > 0 and it > 0 and history[-2] - history[-1] <= tol * history[-2]
        if it == iters or converged:
            break
        centers = _lloyd_update(carry, centers, buf_x, sample_valid, jax.random.fold_in(key_loop, it))
    return centers, np.asarray(history)
