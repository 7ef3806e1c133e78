"""Stage checkpoints (dlr_jax/run/checkpoint.py): parameters round-trip onto the target mesh, and small replicated
arrays are written whole (no per-shape slice compiles), with Orbax's array metadata kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dlr_jax.core.sharding import make_mesh
from dlr_jax.run import checkpoint


class _Params(nnx.Module):
    def __init__(self, rows: int, *, rngs: nnx.Rngs):
        self.small = nnx.Param(jax.random.normal(rngs.params(), (16, 8)))
        self.big = nnx.Param(jax.random.normal(rngs.params(), (rows, 1024)))


def _replicated(model: nnx.Module, mesh) -> nnx.Module:
    rep = NamedSharding(mesh, PartitionSpec())
    for var in (model.small, model.big):
        var.set_value(jax.device_put(var.get_value(), rep))
    return model


def _slices_during_save(monkeypatch, model, out) -> int:
    calls = []
    real = jax.lax.slice_in_dim
    monkeypatch.setattr(jax.lax, "slice_in_dim", lambda *a, **k: calls.append(1) or real(*a, **k))
    checkpoint.save_params(model, out)
    monkeypatch.undo()
    return len(calls)


def test_small_replicated_arrays_are_written_whole_and_restored(monkeypatch, tmp_path):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, as make test sets)")
    mesh = make_mesh(8, 1, 1)
    small = _replicated(_Params(64, rngs=nnx.Rngs(0)), mesh)  # 256 KiB: under the threshold
    assert _slices_during_save(monkeypatch, small, tmp_path / "small") == 0
    handler = ocp.type_handlers.get_type_handler(jax.Array)
    assert handler._min_slice_bytes_for_replica_parallel == checkpoint.REPLICA_PARALLEL_MIN_SLICE_BYTES
    assert handler._array_metadata_store is not None and (tmp_path / "small" / "params" / "array_metadatas").is_dir()
    back = checkpoint.restore_params(lambda: _Params(64, rngs=nnx.Rngs(1)), tmp_path / "small", mesh)
    np.testing.assert_array_equal(np.asarray(back.big[...]), np.asarray(small.big[...]))
    assert back.big[...].sharding.mesh == mesh
    # the control: a replicated array whose per-replica slice is >= the threshold is still saved in parallel
    rows = 8 * checkpoint.REPLICA_PARALLEL_MIN_SLICE_BYTES // (1024 * jnp.dtype(jnp.float32).itemsize)
    big = _replicated(_Params(rows, rngs=nnx.Rngs(0)), mesh)
    assert _slices_during_save(monkeypatch, big, tmp_path / "big") > 0


def test_settling_a_failed_save_does_not_raise_the_threads_own_write_error():
    """Orbax's save threads re-raise their error on `join()`: the full disk the command already reports in one line
    must not come back as a second traceback (exit 1 instead of 75)."""
    import threading

    from dlr_jax.run.checkpoint import settle_background_writes

    class FailedWrite(threading.Thread):
        def join(self, timeout=None):
            super().join(timeout)
            raise OSError(28, "No space left on device")

    FailedWrite.__module__ = "orbax.checkpoint._src.futures.future"
    import time

    t = FailedWrite(target=time.sleep, args=(0.3,))  # still writing when the command settles
    t.start()
    settle_background_writes(timeout=5.0)  # raises OSError without the guard
    assert not t.is_alive()
