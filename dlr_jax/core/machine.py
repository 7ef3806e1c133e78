"""Facts about the host and checkout a number was measured on (benchmarks, evaluations and experiment
reports cite them)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_commit() -> str | None:
    """HEAD of the checkout holding dlr_jax (with `-dirty` if it has local changes), or None."""
    root = Path(__file__).resolve().parents[2]  # the checkout holding the dlr_jax package
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
