"""The largest arrays a compiled program materialises, read from its optimised HLO text.

XLA's `memory_analysis()` gives totals; to see *what* the temporaries are (the vocabulary-sized logits
and their softmax, a gathered embedding table, a stacked KV cache) the planner lists the biggest
values computed at the top level of the entry and loop computations (fusion internals live in
registers and are skipped; parameters, tuples, bitcasts and constants are not new buffers). XLA may
reuse one buffer for several of these values, so the list explains the temporaries' total rather than
adding up to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Any

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*([a-z0-9]+)\[([0-9,]*)\][^ ]*\s+([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]+)"')
_SKIP_OPS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "copy-start", "copy-done",
             "after-all", "partition-id", "replica-id"}


def largest_values(hlo_text: str, *, k: int = 8, vocab: int | Collection[int] | None = None) -> list[dict[str, Any]]:
    """The k largest distinct (shape, op) values outside fusions: bytes, shape, dtype, HLO op, the JAX
    op that made it, and whether a dimension is a vocabulary size (`vocab`: the sizes a program's vocabulary
    dimension can have, e.g. the whole vocabulary and its shard on the tensor axis). Equal, not at least: a
    token count or an MLP width as large as the vocabulary is not a vocabulary-sized value."""
    vocab_dims = set() if vocab is None else {vocab} if isinstance(vocab, int) else set(vocab)
    seen: dict[tuple, dict[str, Any]] = {}
    comp = None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            comp = m.group(1)
            continue
        if comp is None or comp.startswith(("fused", "region", "wrapped", "horizontally_fused")):
            continue
        m = _INSTR.match(line)
        if not m or m.group(4) in _SKIP_OPS or m.group(2) not in _DTYPE_BYTES:
            continue
        dims = tuple(int(d) for d in m.group(3).split(",") if d)
        nbytes = math.prod(dims) * _DTYPE_BYTES[m.group(2)] if dims else _DTYPE_BYTES[m.group(2)]
        op = _OP_NAME.search(line)
        key = (dims, m.group(2), m.group(4))
        row = {"bytes": nbytes, "shape": list(dims), "dtype": m.group(2), "hlo_op": m.group(4),
               "op_name": op.group(1)[-120:] if op else "", "count": 1,
               "vocab_sized": any(d in vocab_dims for d in dims)}
        if key in seen:
            seen[key]["count"] += 1
        else:
            seen[key] = row
    return sorted(seen.values(), key=lambda r: -r["bytes"])[:k]
