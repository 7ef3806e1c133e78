"""TPU splash attention (models/splash.py), run in Pallas interpret mode on CPU: the same outputs and
gradients as the XLA attention at every real position, packed and left-padded rows, on one device and
inside a sharded model forward."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.core import sharding as sh
from dlr_jax.models.transformer import Transformer, attention, causal_mask

T = 128  # one kernel block


def _segments() -> jnp.ndarray:
    seg = np.zeros((2, T), np.int32)
    seg[0, :50], seg[0, 50:110] = 1, 2  # two packed sequences, then padding
    seg[1, 20:] = 1  # left padding, as the sampler's scoring rows have
    return jnp.asarray(seg)


def test_outputs_and_gradients_equal_the_xla_attention():
    rs = np.random.RandomState(0)
    q, k, v = (jnp.asarray(rs.randn(2, T, h, 16), jnp.float32) for h in (4, 2, 2))
    seg = _segments()
    mask, real = causal_mask(seg), np.asarray(seg) != 0
    out = attention(q, k, v, mask, "splash", seg)
    ref = attention(q, k, v, mask, "xla")
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], atol=1e-5)

    # padded rows' outputs are not defined alike (the loss masks them): weight the real ones only
    w = jnp.asarray(rs.randn(*q.shape), jnp.float32) * jnp.asarray(real)[:, :, None, None]
    loss = lambda impl, s: lambda *qkv: jnp.sum(attention(*qkv, mask, impl, s) * w)
    grads = jax.grad(loss("splash", seg), (0, 1, 2))(q, k, v)
    refs = jax.grad(loss("xla", None), (0, 1, 2))(q, k, v)
    for g, r in zip(grads, refs, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)


def test_shapes_the_kernel_does_not_take_stay_on_xla():
    from dlr_jax.models.transformer import resolve_attention

    assert resolve_attention("splash", "tpu", jnp.bfloat16, splash_ok=True) == "splash"
    assert resolve_attention("auto", "tpu", jnp.bfloat16, splash_ok=True) == "splash"
    assert resolve_attention("splash", "cpu", jnp.float32, splash_ok=True) == "splash_interpret"
    assert resolve_attention("splash", "tpu", jnp.bfloat16, splash_ok=False) == "xla"  # decode steps
    assert resolve_attention("auto", "cuda", jnp.bfloat16, splash_ok=True) == "cudnn"
    rs = np.random.RandomState(1)
    q, k, v = (jnp.asarray(rs.randn(1, 6, h, 8), jnp.float32) for h in (4, 2, 2))
    seg = jnp.ones((1, 6), jnp.int32)  # 6 tokens: not a whole block
    np.testing.assert_array_equal(attention(q, k, v, causal_mask(seg), "splash", seg),
                                  attention(q, k, v, causal_mask(seg), "xla"))


@pytest.mark.skipif(jax.device_count() < 8,
                    reason="needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
def test_sharded_model_forward_equals_the_xla_attention():
    """Under shard_map on a (data 2, fsdp 2, tensor 2) mesh: batch split 4 ways, heads 2 ways."""
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, attention="splash")
    mesh = sh.make_mesh(2, 2, 2, devices=jax.devices()[:8])
    model = sh.create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh)
    graphdef, state = nnx.split(model)
    xla_graphdef, _ = nnx.split(Transformer(dataclasses.replace(cfg, attention="xla"), rngs=nnx.Rngs(0)))
    rs = np.random.RandomState(2)
    seg = jnp.concatenate([_segments()] * 2)
    ids = jnp.asarray(rs.randint(0, 64, seg.shape), jnp.int32)
    fwd = lambda g: jax.jit(lambda st, i, s: nnx.merge(g, st)(i, segment_ids=s))
    with sh.use_mesh(mesh):
        out = fwd(graphdef)(state, ids, seg)
        ref = fwd(xla_graphdef)(state, ids, seg)
    real = np.asarray(seg) != 0
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], atol=1e-4)


def test_kernel_compiles_for_a_tpu_slice_with_no_tpu_attached():
    """What the planner does for `--device tpu-v5p`: the Mosaic kernel lowers and compiles for 8 v5p
    chips from this CPU host (libtpu: the `tpu` extra), forward and backward, under a (1, 8, 1) mesh."""
    from dlr_jax.plan.targets import TARGETS, TargetUnavailable, target_mesh

    try:
        mesh = target_mesh(TARGETS["tpu-v5p"], {"data": 1, "fsdp": 8, "tensor": 1})
    except TargetUnavailable as e:
        pytest.skip(f"no TPU compiler here ({e})")
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=jax.NamedSharding(
        mesh, jax.sharding.PartitionSpec(("data", "fsdp"))))
    q, kv = spec(8, 256, 8, 128), spec(8, 256, 2, 128)
    seg = jax.ShapeDtypeStruct((8, 256), jnp.int32, sharding=q.sharding)

    def loss(q, k, v, s):
        return jnp.sum(attention(q, k, v, causal_mask(s), "auto", s).astype(jnp.float32))

    # conftest asks for "highest" matmul precision (fp32 parity tests); Mosaic takes bf16 operands at
    # the default precision only, which is what a TPU run uses
    with sh.use_mesh(mesh), jax.default_matmul_precision("default"):
        text = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, kv, kv, seg).compile().as_text()
    assert "tpu_custom_call" in text
