"""Stage hand-off checkpoints: the final parameters of any NNX model, restored onto the target
mesh. (Training checkpoints with optimizer and data state live in trainer.py.)"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.core.exit_codes import mentions_no_space, no_space_error
from dlr_jax.core.files import MissingStageError, write_text_atomic
from dlr_jax.core.sharding import make_mesh, state_shardings, wait_for_all_processes

# Orbax writes a replicated array "replica-parallel" by default (on CPU and TPU; not when JAX_PLATFORMS names a
# GPU): each replica saves a slice of it, cut by an eager `lax.slice` per array shape, which is one XLA compile per
# shape in every fresh process (for the codebook stage's ~150 small arrays on CPU those compiles cost more than the
# writing). Slicing only pays off for large arrays written from several hosts, so an array whose per-replica slice
# is smaller than this is written whole by one replica.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 4 << 20


class CheckpointUnreadable(RuntimeError):
    """A checkpoint that a run or an evaluation must read does not restore (a truncated or missing file, or none of a
    stage's checkpoints restores): the CLIs say it in one line (exit 2)."""


def short_error(e: BaseException) -> str:
    """`e` in one short line: the root of its `raise ... from` chain (Orbax's "Encountered error while reading array
    index" wraps TensorStore's, which names the file and what is wrong with it), without the TensorStore spec."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = str(e).split(" See full TensorStore details", 1)[0].split(" [tensorstore_spec", 1)[0].strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first[:240]}{'...' if len(first) > 240 else ''}"


def move_aside(path: str | Path) -> Path:
    """Renames a damaged checkpoint to `<name>.damaged-<UTC time>` beside it (kept for inspection, never deleted).
    Orbax lists only directories named by a step number, so a manager no longer sees it."""
    path = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = path.with_name(f"{path.name}.damaged-{stamp}"), 1
    while dest.exists():
        dest, n = path.with_name(f"{path.name}.damaged-{stamp}-{n}"), n + 1
    os.rename(path, dest)
    return dest


_FAILED_READS: set[str] = set()


class _ReportedFailureLogFilter(logging.Filter):
    """Drops the logs (a traceback each) that Orbax's background threads and asyncio's collected tasks write about a
    failure the command reports itself in one line: a write that failed for want of space (exit code 75,
    dlr_jax.core.exit_codes), or the other read errors of a restore already reported as failed (Orbax reads the
    arrays concurrently and raises the first error; the others reach asyncio's logger whenever their tasks are
    collected, `reported_unreadable`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        text = record.getMessage() + (str(exc) if exc is not None else "")
        if (exc is not None and no_space_error(exc) is not None) or mentions_no_space(text):
            return False
        return not any(p in text for p in _FAILED_READS)


_REPORTED_FILTER = _ReportedFailureLogFilter()


def _quiet_reported_failures() -> None:
    """Installs `_ReportedFailureLogFilter` on Orbax's (absl) and asyncio's loggers, and a `sys.unraisablehook` that
    drops "Event loop is closed": TensorStore's callbacks of an operation that Orbax abandoned (its event loop ended
    with the error the command reports) arrive after that loop closed. Idempotent; anything else passes on."""
    for name in ("absl", "asyncio"):
        log = logging.getLogger(name)
        if _REPORTED_FILTER not in log.filters:
            log.addFilter(_REPORTED_FILTER)
    previous = sys.unraisablehook
    if getattr(previous, "dlr_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        previous(unraisable)

    hook.dlr_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def settle_background_writes(timeout: float = 30.0) -> None:
    """Waits, at most `timeout` seconds, for Orbax's background threads of a save that failed (a full disk): a process
    that exits while they run has them fail again at interpreter shutdown, a traceback each ("cannot schedule new
    futures after shutdown", "sys.meta_path is None"), after the command's one line."""
    deadline = time.monotonic() + timeout
    for t in threading.enumerate():
        if t is not threading.current_thread() and type(t).__module__.startswith("orbax."):
            try:
                t.join(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - Orbax's threads re-raise their write error on join: the one reported
                pass


def reported_unreadable(path: str | Path) -> None:
    """`path` (a checkpoint whose restore failed) is reported: asyncio's late logs of its other read errors go."""
    _FAILED_READS.add(str(Path(path).absolute()))
    _quiet_reported_failures()


def configure_orbax() -> None:
    """Re-registers Orbax's jax.Array handler with REPLICA_PARALLEL_MIN_SLICE_BYTES, keeping its array metadata
    store (what records, e.g., a PRNG key's type); idempotent, and every saver of the package calls it first.
    Also keeps a full disk's background-thread tracebacks out of the log (`_quiet_reported_failures`)."""
    _quiet_reported_failures()
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
    try:
        restored = ocp.StandardCheckpointer().restore(d, targets)
    except Exception as e:  # one line (exit 2), not Orbax's traceback; the files are left as they are
        reported_unreadable(d)
        raise CheckpointUnreadable(
            f"{d}: does not restore ({short_error(e)}). If its files are damaged (truncated, missing), rerun the "
            f"training command of the stage that wrote {d.parent}: it rewrites {d.parent.name}/ from the stage's "
            "last checkpoint") from e
    nnx.replace_by_pure_dict(params, restored)
    if jax.tree.leaves(rest):
        # Non-Param variables (none in our models today) are re-initialised, then placed.
        model = make_model()
        nnx.update(model, params)
        return model
    return nnx.merge(graphdef, params)
