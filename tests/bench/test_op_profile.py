"""bench/op_profile.py: op kinds from XLA CPU op names, shapes and jax op paths from compiled HLO, and
a profiler trace's op time by kind."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dlr_jax.bench import op_profile


def test_op_kind():
    assert op_profile.op_kind("ynn_fusion.3") == op_profile.op_kind("dot.12") == "matmuls"
    assert op_profile.op_kind("copy_bitcast_fusion.8") == "layout copies / transposes"
    assert op_profile.op_kind("wrapped_broadcast.6") == "broadcasts"
    assert op_profile.op_kind("add_multiply_fusion") == "elementwise / reductions / other"


def test_hlo_op_names_reads_shape_and_metadata():
    f = jax.jit(lambda x: jnp.tanh(x @ x.T))
    hlo = f.lower(jnp.ones((8, 4))).compile().as_text()
    names = op_profile.hlo_op_names(hlo)
    assert names and all(shape.startswith(("f32[", "(")) for shape, _ in names.values())
    assert any("tanh" in path for _, path in names.values())


def test_op_breakdown_sees_the_matmul():
    a = jnp.ones((256, 256))
    f = jax.jit(lambda x: jnp.sin(x @ x))
    f(a).block_until_ready()
    kinds, top = op_profile.op_breakdown(lambda: f(a).block_until_ready())
    assert kinds.get("matmuls", 0) > 0 and top and all(sec >= 0 for _, sec in top)
