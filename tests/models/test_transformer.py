"""Transformer behaviour that does not need HF weights (HF parity lives in tests/convert/test_decoder.py)."""

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.core import sharding as sh
from dlr_jax.models.transformer import Transformer, segment_positions

CFG = ModelConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=8,
    num_kv_heads=8,
    head_dim=8,
    qk_norm=True,
    attention_bias=True,
)


def _ids(b=8, t=16, seed=0, vocab=128):
    return jnp.asarray(np.random.RandomState(seed).randint(0, vocab, (b, t)))


def _forward(model, ids, **kw):
    g, st = nnx.split(model)
    return jax.jit(lambda st, ids: nnx.merge(g, st)(ids, **kw))(st, ids)


def test_shapes_and_fp32_logits():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    out = model(_ids(2, 5))
    assert out.shape == (2, 5, CFG.vocab_size) and out.dtype == jnp.float32


def test_causal_future_tokens_do_not_change_past():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    a = _ids(1, 12, seed=1)
    b = a.at[:, 8:].set(_ids(1, 4, seed=2))
    np.testing.assert_allclose(model(a)[:, :8], model(b)[:, :8], atol=1e-6)


def test_packed_segments_equal_separate_sequences():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    a, b = _ids(1, 7, seed=3), _ids(1, 9, seed=4)
    packed = jnp.concatenate([a, b, jnp.zeros((1, 4), a.dtype)], axis=1)
    seg = jnp.asarray([[1] * 7 + [2] * 9 + [0] * 4])
    out = model(packed, segment_ids=seg)
    np.testing.assert_allclose(out[:, :7], model(a), atol=1e-5)
    np.testing.assert_allclose(out[:, 7:16], model(b), atol=1e-5)


def test_segment_positions_restart_per_segment():
    seg = jnp.asarray([[0, 0, 1, 1, 1, 2, 2, 0]])
    assert segment_positions(seg).tolist() == [[0, 0, 0, 1, 2, 0, 1, 0]]


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_policies_preserve_values_and_grads(remat):
    ids = _ids(2, 8)

    def loss(model):
        return jnp.mean(jax.nn.logsumexp(model(ids), -1))

    base = Transformer(CFG, rngs=nnx.Rngs(0))
    other = Transformer(dataclasses.replace(CFG, remat=remat), rngs=nnx.Rngs(0))
    g0 = nnx.grad(loss)(base)
    g1 = nnx.grad(loss)(other)
    chex.assert_trees_all_close(g0, g1, atol=1e-6, rtol=1e-7)  # every parameter's gradient


def test_bf16_compute_close_to_fp32():
    ids = _ids(2, 8)
    f32 = Transformer(CFG, rngs=nnx.Rngs(0))
    bf = Transformer(dataclasses.replace(CFG, dtype="bfloat16"), rngs=nnx.Rngs(0))
    a, b = f32(ids), bf(ids)
    assert b.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(a - b))) < 0.05


needs8 = pytest.mark.skipif(
    jax.device_count() < 8,
    reason="needs 8 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8",
)


@needs8
@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 2, 2), (1, 2, 4)])
def test_sharded_forward_equals_single_device(mesh_shape):
    ids = _ids()
    ref = Transformer(CFG, rngs=nnx.Rngs(0))(ids)
    mesh = sh.make_mesh(*mesh_shape)
    model = sh.create_sharded(lambda: Transformer(CFG, rngs=nnx.Rngs(0)), mesh)
    with sh.use_mesh(mesh):
        out = _forward(model, ids)
    chex.assert_trees_all_close(out, ref, atol=1e-5, rtol=1e-7)


@needs8
def test_fsdp_shards_almost_all_parameter_bytes_and_never_materialises():
    mesh = sh.make_mesh(1, 8, 1)
    model = sh.create_sharded(lambda: Transformer(CFG, rngs=nnx.Rngs(0)), mesh)
    state = nnx.state(model, nnx.Param)
    assert sh.sharded_fraction(state) >= 0.95
    # Every sharded matrix is held as 1/8 per device: no device holds a full copy.
    q = model.layers.q_proj[...]
    assert q.sharding.spec[1] == "fsdp"
    for shard in q.addressable_shards:
        assert shard.data.shape == (2, 8, 8, 8)
    full = max(x.nbytes for x in jax.tree.leaves(state))
    assert sh.max_bytes_on_one_device(state) <= full // 8


@needs8
def test_sharded_init_is_one_jitted_program_with_sharded_outputs(monkeypatch):
    """Init must not build the model eagerly on a device and then reshard it."""
    mesh = sh.make_mesh(1, 8, 1)
    puts = []
    real_put = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda *a, **k: puts.append(a) or real_put(*a, **k))
    model = sh.create_sharded(lambda: Transformer(CFG, rngs=nnx.Rngs(0)), mesh)
    assert puts == []
    assert all(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    # Same values as an eager init with the same seed.
    ref = Transformer(CFG, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(
        np.asarray(model.layers.up_proj[...]), np.asarray(ref.layers.up_proj[...]), atol=1e-6
    )


def test_gradient_has_no_activation_sized_transposes():
    """The projections are 2-D matmuls over the flattened (batch, length) dims (`dense`): the weight
    gradients contract one dim, so XLA:CPU feeds the activation gradients to the matmul as they are.
    A 3-D einsum here made it write every MLP activation gradient transposed first (a quarter of an
    SFT step's op time in the `train` benchmark's profile)."""
    cfg = dataclasses.replace(CFG, hidden_size=32, intermediate_size=96, num_heads=4, num_kv_heads=2)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    g, st = nnx.split(model)
    b, t = 4, 20  # 80 tokens: no model width is 80 or a multiple of t

    def loss(st):
        return jnp.mean(nnx.merge(g, st)(_ids(b, t)) ** 2)

    hlo = jax.jit(jax.grad(loss)).lower(st).compile().as_text()
    # Data movement (copy / transpose instructions and the loop fusions named after them) whose
    # result puts a width before the tokens: an activation written transposed, [width, b*t] or
    # [width, b, t] (a copy in the natural [.., tokens, width] order is the scan's own bookkeeping).
    moved = []
    for name, shape in re.findall(r"%((?:copy|transpose)[\w.-]*) = f32\[([\d,]+)\]", hlo):
        dims = [int(s) for s in shape.split(",")]
        if dims[-1] == b * t or dims[-2:] == [b, t]:
            moved.append((name, shape))
    assert not moved, f"activation gradients written transposed in the backward pass: {moved}"


def test_cached_decode_step_neither_transposes_nor_copies_the_cache():
    """A decode step writes its token into the whole cache in place and attention reads the layer's
    slice in the cache's own [b, kv, s, hd] layout. The former layout ([b, s, kv, hd], each layer's
    slice taken out, updated and written back) made XLA:CPU copy and transpose every layer's cache on
    every token: a quarter of the decode loop's op time. (Reading the slice out of the stacked cache is
    still a dynamic-slice fusion, i.e. a copy; the sampler's loop avoids that with per-layer buffers:
    tests/generate/test_sampler.py::test_decode_loop_reads_layer_weights_without_copying_them.)"""
    cfg = dataclasses.replace(CFG, num_heads=4, num_kv_heads=2, head_dim=16)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    g, st = nnx.split(model)
    b, s = 4, 40
    cache = model.init_cache(b, s)
    assert cache.k.shape == (cfg.num_layers, b, cfg.num_kv_heads, s, cfg.head_dim)

    def step(st, ids, cache):
        pos = jnp.zeros(ids.shape, jnp.int32) + cache.index
        return nnx.merge(g, st).forward_cached(ids, pos, jnp.ones(ids.shape, bool), cache)

    # The cache is donated, as the sampler's loop carries it: the write lands in its buffer.
    hlo = jax.jit(step, donate_argnums=2).lower(st, _ids(b, 1), cache).compile().as_text()
    layer_cache = b * s * cfg.num_kv_heads * cfg.head_dim
    moved = [(name, shape) for name, shape in re.findall(r"%((?:copy|transpose)[\w.-]*) = f32\[([\d,]+)\]", hlo)
             if np.prod([int(d) for d in shape.split(",")]) >= layer_cache]
    assert not moved, f"cache-sized copies in a decode step: {moved}"


def _layer_loops(hlo: str) -> list[str]:
    """The op names of the compiled program's `while` loops that are not a scatter's."""
    names = re.findall(r"= \(.*\) while\(.*?op_name=\"([^\"]*)\"", hlo)
    return [n for n in names if "scatter" not in n]


@pytest.mark.parametrize("remat", ["none", "full"])
def test_layer_loop_gives_the_scan_s_loss_and_gradients_without_a_while_loop(remat, monkeypatch):
    """`scan_layers`: a shallow model compiled for CPU runs its layers as a loop (XLA:CPU zero-fills the
    scan's stacked residuals every step); same loss and gradients, no `while` in the compiled step."""
    from dlr_jax.models import transformer

    ids = _ids(4, 16, seed=5)

    def grad_fn(mode):
        g, st = nnx.split(Transformer(dataclasses.replace(CFG, scan_layers=mode, remat=remat), rngs=nnx.Rngs(0)))
        f = jax.jit(jax.value_and_grad(lambda s: jnp.mean(nnx.merge(g, s)(ids) ** 2)))
        return f(st), f.lower(st).compile().as_text()

    (scan_loss, scan_grads), scan_hlo = grad_fn("scan")
    (loop_loss, loop_grads), loop_hlo = grad_fn("loop")
    np.testing.assert_allclose(loop_loss, scan_loss, rtol=1e-6)
    chex.assert_trees_all_close(loop_grads, scan_grads, atol=1e-6, rtol=1e-5)
    # the layers' while loop (a scatter can compile to one too: the embedding's gradient, with XLA:CPU's
    # elemental emitters, tests/xla_env.py)
    assert _layer_loops(scan_hlo) and not _layer_loops(loop_hlo)
    # auto: the loop on CPU up to LOOP_MAX_LAYERS layers; the scan for deeper models and other targets
    auto = dataclasses.replace(CFG, scan_layers="auto")
    assert transformer.loops_layers(auto, 2) and not transformer.loops_layers(auto, transformer.LOOP_MAX_LAYERS + 1)
    monkeypatch.setattr(transformer, "target_platform", lambda: "gpu")
    assert not transformer.loops_layers(auto, 2)
    assert transformer.loops_layers(dataclasses.replace(CFG, scan_layers="loop"), 2)
    with pytest.raises(Exception, match="scan_layers"):
        dataclasses.replace(CFG, scan_layers="unroll")
