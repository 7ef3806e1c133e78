"""Attention (models/attention.py): the backend chosen for the compile target, and every backend's
outputs on CPU equal to the XLA einsums."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def test_attention_is_resolved_from_the_compile_target_not_the_host():
    from jax._src.mesh import AbstractDevice, AbstractMesh
    from jax.sharding import AxisType

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
    h100 = AbstractMesh((1, 1, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3,
                        abstract_device=AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None,
                                                       platform="cuda"))
    with jax.sharding.use_abstract_mesh(h100):
        assert target_platform() == "cuda"
    assert target_platform() == jax.default_backend() == "cpu"


@pytest.mark.parametrize("name", ["auto", "xla", "einsum", "cudnn"])
def test_every_attention_setting_gives_the_same_outputs_on_cpu(name):
    from dlr_jax.models.attention import attention, causal_mask

    rs = np.random.RandomState(0)
    q, k, v = (jnp.asarray(rs.randn(2, 6, h, 8), jnp.float32) for h in (4, 2, 2))
    mask = causal_mask(jnp.ones((2, 6), jnp.int32))
    np.testing.assert_allclose(attention(q, k, v, mask, name), attention(q, k, v, mask, "xla"), atol=1e-5)
