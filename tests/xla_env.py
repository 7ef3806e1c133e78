"""XLA flags of the test session, shared by the test processes and the processes they start.

Test programs are tiny, so compiling them costs more than running them; LLVM at -O0 cuts the CPU
time of a test file by 25-35 % (tests/test_trainer.py: 90 -> 59 s). Results may differ from the
optimised build in the last bits (a reduction's order, an `exp`'s code), far inside the tests'
tolerances; the suite passes at both levels. A level already in $XLA_FLAGS wins, so
`XLA_FLAGS=--xla_backend_optimization_level=3 pytest` (XLA's default) tests the optimised code."""

from __future__ import annotations

import os

_LEVEL = "xla_backend_optimization_level"


def compile_flags() -> str:
    """The optimisation-level flag the test session runs with (the caller's own, if it set one)."""
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.lstrip("-").startswith(_LEVEL + "="):
            return flag
    return f"--{_LEVEL}=0"


def xla_flags(devices: int) -> str:
    """$XLA_FLAGS for a child process with `devices` fake CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {compile_flags()}"
