"""dlr_jax.models.vq: nearest codes, straight-through, losses, noise, k-means, usage, sharding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dlr_jax.models import vq
from dlr_jax.models.vq import (
    UsageEMA,
    VectorQuantizer,
    code_usage,
    kmeans_init,
    nearest_codes,
    quantize,
    refresh_dead_codes,
    squared_distances,
    usage_ema_init,
    usage_ema_reset,
    usage_ema_update,
    usage_ema_value,
    vq_objective,
)


def _data(seed: int = 0, lead=(3, 7), k: int = 50, d: int = 16):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(*lead, d)).astype(np.float32)
    cb = rng.normal(size=(k, d)).astype(np.float32)
    return jnp.asarray(h), jnp.asarray(cb)


def _clusters(seed: int, n_clusters: int, per: int, d: int, spread: float = 10.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, d)) * spread
    x = np.concatenate([c + rng.normal(size=(per, d)) for c in centers]).astype(np.float32)
    return centers, x[rng.permutation(len(x))]


def test_ids_equal_brute_force_argmin():
    h, cb = _data()
    diff = np.asarray(h)[..., None, :].astype(np.float64) - np.asarray(cb)[None, None].astype(np.float64)
    brute = np.sum(diff**2, -1)  # [3, 7, K]
    np.testing.assert_array_equal(np.asarray(nearest_codes(h, cb)), brute.argmin(-1))
    ids, *_ = quantize(h, cb)
    np.testing.assert_array_equal(np.asarray(ids), brute.argmin(-1))
    assert ids.dtype == jnp.int32 and ids.shape == (3, 7)
    d2 = squared_distances(h.reshape(-1, 16), cb)
    np.testing.assert_allclose(np.asarray(d2), brute.reshape(-1, 50), rtol=1e-5, atol=1e-4)


def test_h_st_equals_selected_codes():
    h, cb = _data(1)
    ids, h_st, _, _ = quantize(h, cb)
    assert h_st.shape == h.shape and h_st.dtype == h.dtype
    np.testing.assert_allclose(np.asarray(h_st), np.asarray(cb)[np.asarray(ids)], atol=1e-6)
    hb = h.astype(jnp.bfloat16)
    _, h_st_b, _, _ = quantize(hb, cb)
    assert h_st_b.dtype == jnp.bfloat16


def test_straight_through_gradient():
    h, cb = _data(2)
    w = jnp.asarray(np.random.default_rng(3).normal(size=h.shape).astype(np.float32))

    def f(x):  # any nonlinear downstream loss
        return jnp.sum(jnp.sin(x) * w) + jnp.sum(x**2)

    def via_st(h, cb):
        return f(quantize(h, cb)[1])

    g_h, g_cb = jax.grad(via_st, argnums=(0, 1))(h, cb)
    ids = nearest_codes(h, cb)
    expected = jax.grad(f)(cb[ids])  # gradient w.r.t. the codes that replaced h
    np.testing.assert_allclose(np.asarray(g_h), np.asarray(expected), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(g_cb), 0.0)  # the codebook learns from vq_loss only


def test_losses_match_formulas_and_route_gradients():
    h, cb = _data(4)
    ids, _, vq_loss, commit = quantize(h, cb)
    c = np.asarray(cb)[np.asarray(ids)]
    mse = np.mean((np.asarray(h) - c) ** 2)
    np.testing.assert_allclose(float(vq_loss), mse, rtol=1e-5)
    np.testing.assert_allclose(float(commit), mse, rtol=1e-5)
    np.testing.assert_allclose(float(vq_objective(vq_loss, commit)), 0.25 * (mse + 0.1 * mse), rtol=1e-5)
    np.testing.assert_allclose(float(vq_objective(vq_loss, commit, lam=1.0, beta=2.0)), 3 * mse, rtol=1e-5)

    n = h.size
    g_vq_h, g_vq_cb = jax.grad(lambda h, cb: quantize(h, cb)[2], argnums=(0, 1))(h, cb)
    g_cm_h, g_cm_cb = jax.grad(lambda h, cb: quantize(h, cb)[3], argnums=(0, 1))(h, cb)
    np.testing.assert_array_equal(np.asarray(g_vq_h), 0.0)
    np.testing.assert_array_equal(np.asarray(g_cm_cb), 0.0)
    np.testing.assert_allclose(np.asarray(g_cm_h), 2 * (np.asarray(h) - c) / n, rtol=1e-4, atol=1e-7)
    expected_cb = np.zeros_like(np.asarray(cb))
    np.add.at(expected_cb, np.asarray(ids).reshape(-1), (2 * (c - np.asarray(h)) / n).reshape(-1, 16))
    np.testing.assert_allclose(np.asarray(g_vq_cb), expected_cb, rtol=1e-4, atol=1e-7)


def test_mask_averages_over_valid_positions_only():
    h, cb = _data(5)
    mask = jnp.asarray(np.random.default_rng(6).random((3, 7)) < 0.6)
    ids, _, vq_loss, commit = quantize(h, cb, mask=mask)
    m = np.asarray(mask)
    c = np.asarray(cb)[np.asarray(ids)]
    expected = np.mean((np.asarray(h)[m] - c[m]) ** 2)
    np.testing.assert_allclose(float(vq_loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(commit), expected, rtol=1e-5)
    # padded positions do not move the losses, whatever they hold
    h2 = jnp.where(mask[..., None], h, 1e3)
    _, _, vq2, cm2 = quantize(h2, cb, mask=mask)
    np.testing.assert_allclose(float(vq2), float(vq_loss), rtol=1e-6)
    np.testing.assert_allclose(float(cm2), float(commit), rtol=1e-6)
    _, _, vq0, _ = quantize(h, cb, mask=jnp.zeros((3, 7), bool))
    assert float(vq0) == 0.0
    with pytest.raises(ValueError, match="mask shape"):
        quantize(h, cb, mask=jnp.ones((7, 3), bool))
    with pytest.raises(ValueError, match="feature dim"):
        quantize(h[..., :8], cb)
    with pytest.raises(AssertionError, match="assert_type"):  # chex: integer features are refused
        quantize(jnp.round(h).astype(jnp.int32), cb)


def test_noise_is_deterministic_and_sigma_zero_is_no_noise():
    h, cb = _data(7, k=64)
    key = jax.random.key(11)
    clean = quantize(h, cb)
    for a, b in zip(clean, quantize(h, cb, rng=key, sigma=0.0), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    traced_zero = jax.jit(lambda h, cb, s: quantize(h, cb, rng=key, sigma=s))(h, cb, jnp.float32(0.0))
    np.testing.assert_array_equal(np.asarray(clean[0]), np.asarray(traced_zero[0]))
    for a, b in zip(clean[1:], traced_zero[1:], strict=True):  # jit may fuse the float math differently
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)

    n1 = quantize(h, cb, rng=key, sigma=0.7)
    n2 = quantize(h, cb, rng=key, sigma=0.7)
    np.testing.assert_array_equal(np.asarray(n1[0]), np.asarray(n2[0]))
    assert np.any(np.asarray(n1[0]) != np.asarray(clean[0]))  # the noise does move assignments
    n3 = quantize(h, cb, rng=jax.random.key(12), sigma=0.7)
    assert np.any(np.asarray(n3[0]) != np.asarray(n1[0]))
    # ...but not the value rule: h_st is the chosen code, losses use the clean h
    c = np.asarray(cb)[np.asarray(n1[0])]
    np.testing.assert_allclose(np.asarray(n1[1]), c, atol=1e-6)
    np.testing.assert_allclose(float(n1[2]), np.mean((np.asarray(h) - c) ** 2), rtol=1e-5)


def test_quantize_under_jit_matches_eager():
    h, cb = _data(8)
    key = jax.random.key(0)
    eager = quantize(h, cb, rng=key, sigma=0.3)
    jitted = jax.jit(lambda h, cb, k: quantize(h, cb, rng=k, sigma=0.3))(h, cb, key)
    np.testing.assert_array_equal(np.asarray(eager[0]), np.asarray(jitted[0]))
    for a, b in zip(eager[1:], jitted[1:], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def _need_8_devices():
    if jax.device_count() < 8:
        pytest.skip(
            f"needs 8 devices, have {jax.device_count()}: run with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu"
        )


def test_quantize_with_codebook_sharded_on_8_devices():
    _need_8_devices()
    from dlr_jax.core.sharding import make_mesh

    mesh = make_mesh(data=1, fsdp=1, tensor=8)
    h, cb = _data(9, lead=(4, 9), k=64)
    cb_sharded = jax.device_put(cb, NamedSharding(mesh, PartitionSpec("tensor", None)))
    assert cb_sharded.sharding.shard_shape(cb.shape) == (8, 16)
    key = jax.random.key(3)
    fn = jax.jit(lambda h, cb, k: quantize(h, cb, rng=k, sigma=0.2))
    got = fn(h, cb_sharded, key)
    want = quantize(h, cb, rng=key, sigma=0.2)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    for a, b in zip(got[1:], want[1:], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the gradient w.r.t. the sharded codebook works too
    g = jax.jit(jax.grad(lambda cb: quantize(h, cb)[2]))(cb_sharded)
    g_ref = jax.grad(lambda cb: quantize(h, cb)[2])(cb)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-7)


def test_vector_quantizer_module_and_sharding_metadata():
    abstract = nnx.eval_shape(lambda: VectorQuantizer(rngs=nnx.Rngs(0)))
    assert abstract.codebook.shape == (10_000, 896)
    assert abstract.codebook.get_metadata()["logical_axes"] == ("codes", "latent_dim")

    m = VectorQuantizer(64, 16, sigma=0.5, rngs=nnx.Rngs(0))
    h, _ = _data(10, k=64)
    key = jax.random.key(5)
    out = m(h, rng=key)
    ref = quantize(h, m.codebook[...], rng=key, sigma=0.5)
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(ref[0]))
    no_noise = m(h, rng=key, sigma=0.0)
    np.testing.assert_array_equal(np.asarray(no_noise[0]), np.asarray(nearest_codes(h, m.codebook[...])))


def test_vector_quantizer_is_born_sharded_over_codes():
    _need_8_devices()
    from dlr_jax.core.sharding import create_sharded, make_mesh

    mesh = make_mesh(data=1, fsdp=1, tensor=8)
    sharded = create_sharded(lambda: VectorQuantizer(64, 16, rngs=nnx.Rngs(0)), mesh)
    assert sharded.codebook[...].sharding.spec == PartitionSpec("tensor", None)
    plain = VectorQuantizer(64, 16, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(sharded.codebook[...]), np.asarray(plain.codebook[...]))


def test_code_usage_known_counts():
    ids = jnp.asarray([[0, 0, 1], [3, 0, 1]])
    counts, used, ppl = code_usage(ids, 5)
    np.testing.assert_array_equal(np.asarray(counts), [3, 2, 0, 1, 0])
    assert int(used) == 3
    p = np.array([3, 2, 1]) / 6
    np.testing.assert_allclose(float(ppl), np.exp(-np.sum(p * np.log(p))), rtol=1e-6)
    mask = jnp.asarray([[True, False, True], [False, True, True]])
    counts, used, ppl = code_usage(ids, 5, mask)
    np.testing.assert_array_equal(np.asarray(counts), [2, 2, 0, 0, 0])
    assert int(used) == 2 and abs(float(ppl) - 2.0) < 1e-5
    _, used, ppl = jax.jit(code_usage, static_argnums=1)(jnp.arange(8), 8)
    assert int(used) == 8 and abs(float(ppl) - 8.0) < 1e-4
    _, used, ppl = code_usage(jnp.zeros((0,), jnp.int32), 4)
    assert int(used) == 0 and float(ppl) == 1.0


def test_usage_ema_tracks_counts():
    state = usage_ema_init(4)
    assert isinstance(state, UsageEMA)
    ids = jnp.asarray([0, 0, 2, 2, 2, 3])
    state = usage_ema_update(state, ids)
    np.testing.assert_allclose(np.asarray(usage_ema_value(state)), [2, 0, 3, 1], rtol=1e-5)
    step = jax.jit(usage_ema_update)
    for _ in range(50):
        state = step(state, jnp.asarray([1, 1, 1, 1, 1, 1]))
    v = np.asarray(usage_ema_value(state))
    assert v[1] > 2.0 and v[0] < 2.0 * 0.99**50 + 1e-4 and v[1] > v[2] > 0
    state = usage_ema_reset(state, jnp.asarray([True, False, False, False]), 5.0)
    np.testing.assert_allclose(np.asarray(usage_ema_value(state))[0], 5.0, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(usage_ema_value(state))[1:], v[1:], rtol=1e-6)


def test_refresh_replaces_exactly_the_dead_codes():
    _, cb = _data(11, k=32)
    rng = np.random.default_rng(12)
    usage = jnp.asarray(rng.random(32).astype(np.float32))
    feats = jnp.asarray(rng.normal(size=(20, 16)).astype(np.float32) + 5.0)
    refresh = jax.jit(refresh_dead_codes, static_argnames="threshold")
    new, dead = refresh(cb, usage, feats, jax.random.key(1), threshold=0.3)
    dead_np = np.asarray(usage) < 0.3
    np.testing.assert_array_equal(np.asarray(dead), dead_np)
    assert 0 < dead_np.sum() <= 20
    np.testing.assert_array_equal(np.asarray(new)[~dead_np], np.asarray(cb)[~dead_np])
    fresh = np.asarray(new)[dead_np]
    dist = np.linalg.norm(fresh[:, None] - np.asarray(feats)[None], axis=-1)
    assert np.all(dist.min(1) < 0.2)  # a recent feature plus small noise
    assert len(set(dist.argmin(1).tolist())) == dead_np.sum()  # distinct features while they last
    state = UsageEMA(usage, jnp.asarray(10**6, jnp.int32))  # bias correction ~1 at a large step
    new2, dead2 = refresh(cb, state, feats, jax.random.key(1), threshold=0.3)
    np.testing.assert_array_equal(np.asarray(dead2), dead_np)
    np.testing.assert_allclose(np.asarray(new2), np.asarray(new), atol=1e-6)


def test_refresh_farthest_gives_dead_codes_the_worst_quantized_features():
    # two live codes at 0 and 10 (1-d in 4 dims); features near each, and a cluster at 30 that code 10 holds badly
    live = np.zeros((6, 4), np.float32)
    live[1, 0] = 10.0
    usage = jnp.asarray([5.0, 5.0, 0.0, 0.0, 0.0, 0.0])
    rng = np.random.default_rng(0)
    near = rng.normal(scale=0.1, size=(12, 4)).astype(np.float32) + np.where(np.arange(12)[:, None] % 2, 10.0, 0.0) * (
        np.arange(4)[None] == 0)
    far = rng.normal(scale=0.1, size=(4, 4)).astype(np.float32) + 30.0 * (np.arange(4)[None] == 0)
    feats = jnp.asarray(np.concatenate([near, far]))  # the far ones last: a random order rarely puts all 4 first
    refresh = jax.jit(refresh_dead_codes, static_argnames=("threshold", "pick"))
    new, dead = refresh(jnp.asarray(live), usage, feats, jax.random.key(0), threshold=0.5, pick="farthest")
    np.testing.assert_array_equal(np.asarray(dead), [False, False, True, True, True, True])
    fresh = np.asarray(new)[2:]
    assert np.all(np.abs(fresh[:, 0] - 30.0) < 1.0), fresh[:, 0]  # all four dead codes take the cluster at 30
    np.testing.assert_array_equal(np.asarray(new)[:2], live[:2])
    rand, _ = refresh(jnp.asarray(live), usage, feats, jax.random.key(0), threshold=0.5, pick="random")
    assert np.sum(np.abs(np.asarray(rand)[2:, 0] - 30.0) < 1.0) < 4  # what "random" gives on the same inputs
    with pytest.raises(ValueError, match="pick"):
        refresh_dead_codes(jnp.asarray(live), usage, feats, jax.random.key(0), 0.5, pick="nearest")


def test_kmeans_recovers_well_separated_clusters():
    centers, x = _clusters(0, n_clusters=6, per=150, d=8)
    cb, hist = kmeans_init(x, 6, rng=jax.random.key(0), iters=10, batch_size=128)
    assert cb.shape == (6, 8) and hist.shape == (11,)
    dist = np.linalg.norm(np.asarray(cb)[:, None] - centers[None], axis=-1)
    assert np.all(dist.min(0) < 0.5) and len(set(dist.argmin(0).tolist())) == 6
    assert abs(hist[-1] - 8.0) < 1.0  # unit noise in 8 dims: ~8 per point
    # streamed: a list of batches and a callable give the same kind of answer
    for feats in ([x[:400], x[400:]], lambda: (x[i : i + 128] for i in range(0, len(x), 128))):
        cb2, hist2 = kmeans_init(feats, 6, rng=jax.random.key(1), iters=10, batch_size=128)
        dist = np.linalg.norm(np.asarray(cb2)[:, None] - centers[None], axis=-1)
        assert np.all(dist.min(0) < 0.5)


def test_kmeans_inertia_is_monotone():
    # more codes than clusters and a few overlapping blobs: Lloyd needs many real steps
    _, x = _clusters(1, n_clusters=5, per=200, d=8, spread=1.0)
    for seed in range(3):
        _, hist = kmeans_init(x, 12, rng=jax.random.key(seed), iters=15, batch_size=128)
        assert hist[-1] < hist[0]
        assert np.all(np.diff(hist) <= 1e-6 * hist[:-1]), hist


def test_kmeans_early_stop_and_bad_input():
    _, x = _clusters(2, n_clusters=6, per=50, d=8)
    _, hist = kmeans_init(x, 6, rng=jax.random.key(0), iters=50, tol=1e-6, batch_size=128)
    assert len(hist) < 51
    with pytest.raises(TypeError, match="one-shot iterator"):
        kmeans_init(iter([x]), 6, rng=jax.random.key(0))
    with pytest.raises(ValueError, match="at least k=400"):
        kmeans_init(x, 400, rng=jax.random.key(0), batch_size=128)
    with pytest.raises(ValueError, match=r"batch 1 has shape \(5, 3\)"):
        kmeans_init([x, x[:5, :3]], 6, rng=jax.random.key(0), batch_size=128)


def test_lloyd_update_reseeds_empty_clusters_from_far_points():
    centers = jnp.asarray(np.arange(12, dtype=np.float32).reshape(4, 3))
    sums = jnp.asarray(np.ones((4, 3), np.float32) * np.array([[2], [0], [6], [0]], np.float32))
    counts = jnp.asarray([2.0, 0.0, 3.0, 0.0])
    far_d = jnp.asarray([9.0, 4.0, 1.0])
    far_x = jnp.asarray([[100.0] * 3, [50.0] * 3, [20.0] * 3])
    sample = jnp.zeros((5, 3))
    carry = (sums, counts, far_d, far_x)
    new = vq._lloyd_update(carry, centers, sample, jnp.ones(5, bool), jax.random.key(0))
    np.testing.assert_allclose(np.asarray(new), [[1] * 3, [100] * 3, [2] * 3, [50] * 3])
