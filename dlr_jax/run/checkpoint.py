"""Stage hand-off checkpoints: the final parameters of any NNX model, restored onto the target
mesh. (Training checkpoints with optimizer and data state live in trainer.py.)"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.core.files import MissingStageError, write_text_atomic
from dlr_jax.core.sharding import make_mesh, state_shardings, wait_for_all_processes

# Orbax writes a replicated array "replica-parallel" by default (on CPU and TPU; not when JAX_PLATFORMS names a
# GPU): each replica saves a slice of it, cut by an eager `lax.slice` per array shape, which is one XLA compile per
# shape in every fresh process (3 s a checkpoint for the codebook stage's ~150 small arrays on CPU, more than the
# writing). Slicing only pays off for large arrays written from several hosts, so an array whose per-replica slice
# is smaller than this is written whole by one replica.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 4 << 20


def configure_orbax() -> None:
    """Re-registers Orbax's jax.Array handler with REPLICA_PARALLEL_MIN_SLICE_BYTES, keeping its array metadata
    store (what records, e.g., a PRNG key's type); idempotent, and every saver of the package calls it first."""
    th, least = ocp.type_handlers, REPLICA_PARALLEL_MIN_SLICE_BYTES
    old = th.get_type_handler(jax.Array)
    if getattr(old, "_min_slice_bytes_for_replica_parallel", None) != least:
        store = getattr(old, "_array_metadata_store", None)
        absl = logging.getLogger("absl")  # Orbax warns of every override, once per process: a line in every stage's log
        level = absl.level
        absl.setLevel(logging.ERROR)
        try:
            th.register_type_handler(jax.Array, th.ArrayHandler(min_slice_bytes_for_replica_parallel=least,
                                                                array_metadata_store=store), override=True)
        finally:
            absl.setLevel(level)


def save_params(model: nnx.Module, out_dir: str | Path, meta: Mapping[str, Any] | None = None) -> Path:
    """Writes `<out_dir>/params` (Orbax) and `<out_dir>/meta.json`; overwrites."""
    configure_orbax()
    out = Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(out / "params", nnx.to_pure_dict(nnx.state(model, nnx.Param)), force=True)
    ckptr.wait_until_finished()
    if jax.process_index() == 0:
        write_text_atomic(out / "meta.json", json.dumps(dict(meta or {}), indent=2))
    wait_for_all_processes(f"save_params {out}")  # the others may read meta.json next (the next stage)
    return out


def read_meta(ckpt_dir: str | Path) -> dict[str, Any]:
    f = Path(ckpt_dir) / "meta.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f}: not found; expected a directory written by save_params")
    return json.loads(f.read_text())


def restore_params(
    make_model: Callable[[], nnx.Module],
    ckpt_dir: str | Path,
    mesh: Mesh | None = None,
    rules: str | Mapping = "fsdp",
) -> nnx.Module:
    """Builds `make_model()` abstractly and restores its Params onto shardings derived from the
    abstract model's logical axes (never from the saved sharding metadata)."""
    d = Path(ckpt_dir).absolute() / "params"
    if not d.exists():
        raise MissingStageError(f"{d}: no saved parameters (did the previous stage finish?)")
    mesh = mesh or make_mesh(1, 1, 1, devices=jax.local_devices()[:1])  # this process's own device
    abstract = nnx.eval_shape(make_model)
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    shardings = state_shardings(params, mesh, rules)
    targets = jax.tree.map(
        lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
        nnx.to_pure_dict(params),
        nnx.to_pure_dict(shardings),
    )
    restored = ocp.StandardCheckpointer().restore(d, targets)
    nnx.replace_by_pure_dict(params, restored)
    if jax.tree.leaves(rest):
        # Non-Param variables (none in our models today) are re-initialised, then placed.
        model = make_model()
        nnx.update(model, params)
        return model
    return nnx.merge(graphdef, params)
