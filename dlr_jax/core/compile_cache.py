"""XLA's persistent compilation cache for the command-line entry points (train, evaluate).

Why: on a GPU the first GRPO step (its rollout, scoring and update compiled, then run) is slow even on a
small Llama, almost all of it XLA's GEMM autotuning (BENCHMARKS.md, section "GRPO step on a GPU"), and every
process pays it again: each stage, each evaluation, each restart after preemption. With the cache a rerun of
the same shapes loads the executables (and JAX keeps XLA's per-fusion autotuning results beside them) from
disk instead, and that first step costs a small fraction of it.

Where, in order:
- `JAX_COMPILATION_CACHE_DIR` (JAX's own variable) set: JAX uses it; nothing changes here.
- `DLR_COMPILE_CACHE=off`: no cache (of ours).
- `DLR_COMPILE_CACHE=/some/folder`: that folder, on every backend.
- otherwise on GPU and TPU: `$XDG_CACHE_HOME/dlr_jax/xla` (default `~/.cache/dlr_jax/xla`); on CPU none,
  so test and CI runs stay hermetic (and XLA:CPU compiles of the tiny config take seconds).

The cache key covers the program, the compile options, the backend and the jax/jaxlib versions, so one
folder serves every run and version on a machine; stale entries are never read, only left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV = "DLR_COMPILE_CACHE"


def default_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlr_jax" / "xla"


def choose_dir(setting: str, backend: str, jax_dir: str) -> str | None:
    """The folder to use (None: no cache, or JAX's own `jax_dir` already set) for `DLR_COMPILE_CACHE`
    value `setting` ("" when unset) on `backend` ("cpu", "gpu", "tpu", ...)."""
    setting = setting.strip()
    if setting.lower() == "off" or jax_dir:
        return None
    if setting:
        return setting
    return str(default_dir()) if backend != "cpu" else None


def enable(log: bool = True) -> str | None:
    """Turns the cache on as the module docstring says; returns the folder now in use (JAX's own too),
    or None. Call after `jax.distributed.initialize` and before the first compile."""
    jax_dir = jax.config.jax_compilation_cache_dir or ""
    chosen = choose_dir(os.environ.get(ENV, ""), jax.default_backend(), jax_dir)
    if chosen is None:
        return jax_dir or None
    Path(chosen).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", chosen)
    if log and jax.process_index() == 0:
        print(f"[dlr_jax] XLA compilation cache: {chosen} ({ENV}=off turns it off)", flush=True)
    return chosen
