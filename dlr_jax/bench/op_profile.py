"""Where an XLA CPU program's time goes: op time by kind from a `jax.profiler` trace, the costliest ops
named by their compiled HLO (result shape and jax op path). Used by the SFT-step benchmark (train.py)
and its worker (train_side.py)."""

from __future__ import annotations

import collections
import gzip
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

_CONTROL = ("while", "conditional", "call", "wrapped_call")  # their bodies' ops are counted themselves


def op_kind(name: str) -> str:
    """Coarse kind of an XLA CPU op from its (fusion) name."""
    base = name.split(".")[0].lower()
    if any(k in base for k in ("ynn", "dot", "gemm", "matmul", "convolution", "onednn")):
        return "matmuls"
    if base.startswith(("copy", "transpose")):
        return "layout copies / transposes"
    if "broadcast" in base:
        return "broadcasts"
    if "scatter" in base or "gather" in base:
        return "gathers / scatters"
    return "elementwise / reductions / other"


def hlo_op_names(hlo_text: str) -> dict[str, tuple[str, str]]:
    """Instruction name -> (its result shape, the jax op path in its metadata), from compiled HLO."""
    found = re.findall(r"^\s*(?:ROOT )?%?([\w.-]+) = (\S+?)(?:\{[\d,]*\})? .*?metadata=\{[^}]*op_name=\"([^\"]+)\"",
                       hlo_text, re.M)
    return {name: (shape, path) for name, shape, path in found}


def op_breakdown(run: Callable[[], Any], steps: int = 2) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Profiles `steps` calls of `run`: (op time per call in seconds by `op_kind`, the five
    costliest ops as (name, seconds per call)). Empty if the trace holds no op events."""
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        try:
            for _ in range(steps):
                run()
        finally:
            jax.profiler.stop_trace()
        files = sorted(Path(tmp).rglob("*.trace.json.gz"))
        events = json.loads(gzip.decompress(files[-1].read_bytes()))["traceEvents"] if files else []
    per_op: dict[str, float] = collections.Counter()
    for e in events:
        op = (e.get("args") or {}).get("hlo_op")  # only XLA's thunk events name an HLO op
        if e.get("ph") != "X" or not op or op.split(".")[0] in _CONTROL:
            continue
        per_op[op] += e.get("dur", 0) / 1e6 / steps
    kinds: dict[str, float] = collections.Counter()
    for name, sec in per_op.items():
        kinds[op_kind(name)] += sec
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:5]
    return dict(kinds), top


def describe_op(name: str, seconds: float, shape: str, path: str) -> str:
    """`name` (what it computes, from its kind and jax op path) and its time, for the interpretation."""
    parts = path.split("/")
    what = parts[-2] if parts[-1] == "dot_general" and len(parts) > 1 else parts[-1]
    kind = op_kind(name)
    if kind == "layout copies / transposes":
        desc = f"`{what}` gradient written transposed into `{shape}` by a plain loop"
    elif kind == "matmuls":
        desc = f"matmul `{what}` into `{shape}`"
    else:
        desc = f"{kind.split(' / ')[0]} `{what}` into `{shape}`"
    return f"`{name}` ({desc}, {1e3 * seconds:.0f} ms)"
