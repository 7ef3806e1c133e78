import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from dlr_jax.core import sharding as sh


def test_logical_to_spec_maps_and_never_reuses_a_mesh_axis():
    assert sh.logical_to_spec(("layers", "embed", "mlp"), rules="fsdp") == PartitionSpec(
        None, "fsdp", "tensor"
    )
    # vocab and mlp both want "tensor": the second gets nothing
    assert sh.logical_to_spec(("vocab", "mlp"), rules="fsdp") == PartitionSpec("tensor", None)
    assert sh.logical_to_spec(("batch", "length"), rules="fsdp") == PartitionSpec(("data", "fsdp"), None)


def test_unknown_logical_axis_is_an_error():
    with pytest.raises(KeyError, match="no rule"):
        sh.logical_to_spec(("embedd",))


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices (XLA_FLAGS)")
def test_indivisible_dims_fall_back_to_replication_and_mesh_is_auto():
    mesh = sh.make_mesh(1, -1, 1)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    assert sh.logical_to_spec(("embed",), (12,), mesh) == PartitionSpec(None)
    assert sh.logical_to_spec(("embed",), (16,), mesh) == PartitionSpec("fsdp")


def test_bad_mesh_shapes_are_clear():
    n = jax.device_count()
    with pytest.raises(ValueError, match="needs"):
        sh.make_mesh(1, n + 1, 1)
    with pytest.raises(ValueError, match="at most one"):
        sh.make_mesh(-1, -1, 1)
    assert sh.parse_mesh_spec("data=2,fsdp=4,tensor=1") == {"data": 2, "fsdp": 4, "tensor": 1}
    with pytest.raises(ValueError, match="bad mesh spec"):
        sh.parse_mesh_spec("dp=2")


def test_process_agreement_and_barrier_with_one_process():
    from dlr_jax.core.sharding import all_processes_ok, wait_for_all_processes

    assert all_processes_ok(True) is True and all_processes_ok(False) is False
    wait_for_all_processes("no other process: returns at once")


def test_host_values_fetch_local_arrays_in_one_device_get_as_numpy(monkeypatch):
    # (arrays spanning other processes are gathered instead: tests/test_multiprocess.py runs that path)
    fetches = []
    real_get = jax.device_get
    monkeypatch.setattr(sh.jax, "device_get", lambda xs: fetches.append(len(xs)) or real_get(xs))
    n = jax.device_count()
    mesh = sh.make_mesh(n, 1, 1)
    x = jax.device_put(np.arange(2 * n).reshape(n, 2), NamedSharding(mesh, PartitionSpec("data")))
    y = jnp.float32(1.5)
    a, b = sh.host_values(x, y)  # the sampler's outputs come back this way
    assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
    np.testing.assert_array_equal(a, np.arange(2 * n).reshape(n, 2))
    assert float(b) == 1.5 and fetches == [2]  # both arrays in one device_get
