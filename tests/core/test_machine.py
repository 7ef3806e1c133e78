"""The host's CPU name, as benchmarks and experiment reports cite it."""

from __future__ import annotations

from pathlib import Path

from dlr_jax.core.machine import cpu_model


def test_cpu_model_is_cpuinfo_model_name_when_there_is_one():
    name = cpu_model()
    assert isinstance(name, str) and name
    info = Path("/proc/cpuinfo")
    if info.is_file():
        names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")]
        if names:
            assert name == names[0]
