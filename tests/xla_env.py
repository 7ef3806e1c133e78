"""XLA flags of the test session, shared by the test processes and the processes they start.

Test programs are tiny, so compiling them costs more than running them, and two flags cut the compile:
- LLVM at -O0 (`xla_backend_optimization_level=0`): LLVM's optimisation passes are a large share of a test
  file's CPU time and buy nothing on programs this small.
- XLA:CPU's older elemental fusion emitters instead of its MLIR ones (`xla_cpu_use_fusion_emitters=false`):
  the MLIR emitters compile a program of many small fusions (the codebook stage's train step, ~400 fusions
  at micro size) far more slowly. README's "Testing notes" has the timings.
Results may differ from the default build in the last bits (a reduction's order, an `exp`'s code), far
inside the tests' tolerances; the suite passes either way. A setting already in $XLA_FLAGS wins, so
`XLA_FLAGS="--xla_backend_optimization_level=3 --xla_cpu_use_fusion_emitters=true" pytest` (XLA's
defaults) tests the code users run.

With libtpu installed (the `tpu` extra, for the planner's deviceless TPU compiles) the second flag is left
out: libtpu parses $XLA_FLAGS as well, and aborts the process on a flag its own build does not know."""

from __future__ import annotations

import importlib.util
import os

_DEFAULTS = {"xla_backend_optimization_level": "0"}
if importlib.util.find_spec("libtpu") is None:
    _DEFAULTS["xla_cpu_use_fusion_emitters"] = "false"


def compile_flags() -> list[str]:
    """The compile flags the test session runs with: the caller's own where $XLA_FLAGS sets one."""
    given = {}
    for flag in os.environ.get("XLA_FLAGS", "").split():
        name, _, _ = flag.lstrip("-").partition("=")
        given[name] = flag
    return [given.get(name, f"--{name}={value}") for name, value in _DEFAULTS.items()]


def xla_flags(devices: int) -> str:
    """$XLA_FLAGS for a child process with `devices` fake CPU devices."""
    return " ".join([f"--xla_force_host_platform_device_count={devices}", *compile_flags()])
