"""A data iterator's position in a checkpoint, one per process.

Orbax writes a JSON checkpoint item from the primary process only, so a multi-process run that saved
`data_iter.get_state()` as it is would keep process 0's position for every process. That is right
when every process reads the same stream (the default: each takes its shard of one global batch),
wrong when positions differ (data.pack=true: each process packs its own rows), where a resumed run
would skip or repeat examples on every other process. The positions are therefore gathered and saved
as `{"per_process": [state_0, state_1, ...]}`; each process restores its own."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

PER_PROCESS = "per_process"


def gather_states(state: Any, process_count: int) -> Any:
    """What to save: `state` itself with one process, else every process's state (a collective:
    every process calls it with its own)."""
    if process_count == 1:
        return state
    from jax.experimental import multihost_utils

    raw = np.frombuffer(json.dumps(state).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int32(raw.size))).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[: raw.size] = raw
    rows = np.asarray(multihost_utils.process_allgather(buf)).reshape(len(sizes), -1)
    return {PER_PROCESS: [json.loads(bytes(rows[i, : int(n)]).decode()) for i, n in enumerate(sizes)]}


def own_state(saved: Any, process_index: int, process_count: int) -> Any:
    """This process's position from what `gather_states` saved. A single state (one process, or a
    checkpoint written before positions were per process) is every process's, and so is one that
    every process saved alike (any process count resumes it: the iterator checks what it needs)."""
    if not (isinstance(saved, dict) and set(saved) == {PER_PROCESS}):
        return saved
    states = saved[PER_PROCESS]
    if all(s == states[0] for s in states):
        return states[0]
    if len(states) != process_count:
        raise ValueError(
            f"the checkpoint's data positions were saved by {len(states)} processes, this run has "
            f"{process_count}: each process's position in the data cannot be carried over; resume with "
            f"{len(states)} processes, or start the stage over in a new workdir"
        )
    return states[process_index]
