"""The line protocol between `grpo_peers` and its GRPO workers (one process per framework).

Standard library only: the peer drivers (`peer_trl.py`, `peer_tunix.py`) run under other virtual
environments, where `dlr_jax` is not installed, and import this file by path (their own folder is
first on `sys.path`).

A worker reads the workload (JSON, `write_workload`), sets itself up, then prints one `READY` line
(versions, unmatched settings) and waits. On every `step` line on stdin it runs one whole GRPO
step (generate, score, rewards, mu updates) and prints one `STEP` line with its seconds per phase;
`quit` (or end of input) ends it. Protocol lines start with `@@` so that anything the frameworks
print on stdout is told apart (and passed through as log).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PREFIX = "@@"
READY, STEP, ERROR = "READY", "STEP", "ERROR"
PHASES = ("generate", "score", "rewards", "update")  # seconds; `total` is the whole step


def write_workload(path: Path, workload: dict[str, Any]) -> None:
    path.write_text(json.dumps(workload, indent=1))


def load_workload(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def send(kind: str, payload: dict[str, Any]) -> None:
    """One protocol line on stdout (flushed: the orchestrator is waiting for it)."""
    sys.stdout.write(f"{PREFIX}{kind} {json.dumps(payload)}\n")
    sys.stdout.flush()


def parse(line: str) -> tuple[str, dict[str, Any]] | None:
    """(kind, payload) of a protocol line; None for anything else (a framework's own output)."""
    line = line.strip()
    if not line.startswith(PREFIX):
        return None
    kind, _, rest = line[len(PREFIX):].partition(" ")
    try:
        payload = json.loads(rest) if rest else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed {kind} line from a GRPO worker: {line[:200]!r} ({e})") from e
    if not isinstance(payload, dict):
        raise ValueError(f"{kind} line from a GRPO worker carries {type(payload).__name__}, not an object")
    return kind, payload


def wait_command() -> str:
    """The next command from the orchestrator: `step` or `quit` (end of input counts as quit)."""
    return sys.stdin.readline().strip() or "quit"


def step_record(total: float, **phases: float) -> dict[str, float]:
    """A STEP payload: every phase of `PHASES` (0 where a framework has none) plus `total`."""
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise ValueError(f"unknown phase(s) {sorted(unknown)}; phases are {PHASES}")
    return {p: float(phases.get(p, 0.0)) for p in PHASES} | {"total": float(total)}


def cheap_reward(ids: list[int]) -> float:
    """The workload's reward: the share of even token ids in a completion. It costs nothing next to a
    model step, and varies within a group, so advantages are non-zero and updates do real work."""
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)
