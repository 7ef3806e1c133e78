"""A benchmark side in its own process, driven by `peer_protocol` lines (`grpo_peers`, `train`).

Why processes: two frameworks in one process share its allocator and thread pools, and leave each
other slower than either is alone. On the `train` benchmark's medium case both sides' steps slowed
once the other's steps had run in the same process, even with a pause between them, and a user runs
only one of them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dlr_jax.bench import common
from dlr_jax.bench import peer_protocol as protocol


class Worker:
    """One side's worker process: commands on its stdin, protocol lines back on its stdout, anything
    else it prints (and its stderr) into `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path, log: Callable[[str], None] = print,
                 env: Mapping[str, str] | None = None):
        """`env`: variables set for the worker on top of this process's environment."""
        self.name, self.log = name, log
        self.log_file = log_path.open("w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log_file,
                                     text=True, bufsize=1, cwd=common.REPO, env={**os.environ, **(env or {})})
        self.log_path = log_path

    def expect(self, kind: str) -> dict[str, Any]:
        """Reads stdout up to the next `kind` line; the worker's other output goes to its log."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = protocol.parse(line)
            if msg is None:
                self.log_file.write(line)
                continue
            if msg[0] == kind:
                return msg[1]
            raise RuntimeError(f"{self.name}: expected {kind}, got {msg[0]} {msg[1]}")
        self.proc.wait()
        self.log_file.flush()
        tail = self.log_path.read_text().strip().splitlines()[-15:]
        raise RuntimeError(f"{self.name} worker exited (code {self.proc.returncode}) before {kind}:\n"
                           + "\n".join(tail))

    def call(self, command: str, kind: str) -> dict[str, Any]:
        """Sends one command line and returns the payload of the `kind` line that answers it."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(kind)

    def step(self) -> dict[str, float]:
        return self.call("step", protocol.STEP)

    def close(self) -> None:
        try:
            if self.proc.stdin is not None and self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.log_file.close()
