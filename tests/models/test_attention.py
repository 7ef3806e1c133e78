"""Attention (models/attention.py): the backend chosen for the compile target, and every backend's
outputs on CPU equal to the XLA einsums."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def test_attention_is_resolved_from_the_compile_target_not_the_host():
    from dlr_jax.models.attention import resolve_attention, target_platform

    bf16, f32 = jnp.bfloat16, jnp.float32
    assert resolve_attention("auto", "cuda", bf16) == "cudnn"
    assert resolve_attention("auto", "gpu", jnp.float16) == "cudnn"
    assert resolve_attention("auto", "cuda", f32) == "xla"  # the cuDNN kernel takes bf16/fp16 only
    assert resolve_attention("auto", "tpu", bf16) == resolve_attention("auto", "cpu", bf16) == "xla"
    assert resolve_attention("einsum", "cuda", bf16) == resolve_attention("xla", "cuda", bf16) == "xla"
    assert resolve_attention("cudnn", "cuda", bf16) == "cudnn"
    assert resolve_attention("cudnn", "cpu", bf16) == "dot_product_attention"  # GPU configs run in CPU tests
    with pytest.raises(ValueError, match="auto|xla|cudnn|splash"):
        resolve_attention("flash", "cuda", bf16)
    # A deviceless H100 mesh on this CPU host: the target is the mesh's platform, not jax.default_backend().
    with jax.sharding.use_abstract_mesh(_h100_mesh()):
        assert target_platform() == "cuda"
    assert target_platform() == jax.default_backend() == "cpu"


def _h100_mesh():
    from jax._src.mesh import AbstractDevice, AbstractMesh
    from jax.sharding import AxisType

    return AbstractMesh((1, 1, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3,
                        abstract_device=AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None,
                                                       platform="cuda"))


@pytest.mark.parametrize("contract", [1, 2])
def test_dense_is_one_2d_matmul_on_cpu_and_the_einsum_elsewhere_with_equal_values_and_gradients(contract):
    # the 2-D form is an XLA:CPU optimisation; XLA:GPU's Triton tiling fails on its lm-head weight gradient
    # (models/attention.py dense), so a GPU target gets the einsum: the same numbers either way
    from dlr_jax.models.attention import dense

    rs = np.random.RandomState(0)
    x = jnp.asarray(rs.randn(2, 5, *(3, 4)[:contract]), jnp.float32)
    w = jnp.asarray(rs.randn(*(3, 4)[:contract], 7), jnp.float32)
    loss = lambda x, w: jnp.sum(jnp.sin(dense(x, w, contract=contract)))  # noqa: E731
    cpu = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    with jax.sharding.use_abstract_mesh(_h100_mesh()):
        gpu = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
    prims = lambda j: [e.primitive.name for e in j.jaxpr.eqns]  # noqa: E731
    forward_dots = lambda j: [e for e in j.jaxpr.eqns if e.primitive.name == "dot_general"][0]  # noqa: E731
    assert forward_dots(cpu).invars[0].aval.ndim == 2 and "reshape" in prims(cpu)
    assert forward_dots(gpu).invars[0].aval.ndim == 2 + contract and "reshape" not in prims(gpu)
    got_cpu, got_gpu = (jax.core.eval_jaxpr(j.jaxpr, j.consts, x, w) for j in (cpu, gpu))
    for a, b in zip(got_cpu, got_gpu, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert got_cpu[0].shape == () and got_cpu[1].shape == x.shape and got_cpu[2].shape == w.shape


@pytest.mark.parametrize("contract", [1, 2])
def test_an_out_major_weight_gives_the_same_projection_as_out_major_matmul_xla_keeps(contract):
    """`OutMajor.of(w)` holds w as [*out, *in]; `dense` multiplies it as wt @ x^T and XLA keeps that form
    (the barriers stop its simplifier from turning it back into x @ wt^T). Same values as the plain weight."""
    import re

    from dlr_jax.models.attention import OutMajor, dense

    rs = np.random.RandomState(1)
    x = jnp.asarray(rs.randn(4, 1, *(8, 6)[:contract]), jnp.float32)
    w = jnp.asarray(rs.randn(*(8, 6)[:contract], 5, 3), jnp.float32)
    om = jax.jit(lambda x, w: dense(x, OutMajor.of(w, contract), contract=contract))
    np.testing.assert_allclose(om(x, w), dense(x, w, contract=contract), rtol=1e-6, atol=1e-6)
    assert OutMajor.of(w, contract).wt.shape == (5, 3, *(8, 6)[:contract])
    dots = re.findall(r"= f32\[([\d,]+)\]\{[\d,]+\} dot\([^)]*\), lhs_contracting_dims=\{(\d)\}, "
                      r"rhs_contracting_dims=\{(\d)\}", om.lower(x, w).compile().as_text())
    assert dots == [("15,4", "1", "0")], dots  # [out, rows] = [out, in] @ [in, rows]
    with pytest.raises(ValueError, match="contract"):
        dense(x, OutMajor.of(w, contract), contract=3 - contract)


@pytest.mark.parametrize("name", ["auto", "xla", "einsum", "cudnn"])
def test_every_attention_setting_gives_the_same_outputs_on_cpu(name):
    from dlr_jax.models.attention import attention, causal_mask

    rs = np.random.RandomState(0)
    q, k, v = (jnp.asarray(rs.randn(2, 6, h, 8), jnp.float32) for h in (4, 2, 2))
    mask = causal_mask(jnp.ones((2, 6), jnp.int32))
    np.testing.assert_allclose(attention(q, k, v, mask, name), attention(q, k, v, mask, "xla"), atol=1e-5)
