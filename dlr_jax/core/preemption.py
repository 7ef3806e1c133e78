"""Preemption: SIGTERM / SIGINT ask the run to save and stop, and the process says so in its exit code.

One process-wide stop request (schedulers send SIGTERM, people press Ctrl-C). A training loop polls
`should_stop()` at its step boundaries, saves a checkpoint and returns `preempted=True`; the CLI then
starts nothing else and exits with `exit_code()`:

    143 = 128 + SIGTERM   (preempted by the scheduler: rerun the same command to resume)
    130 = 128 + SIGINT    (interrupted with Ctrl-C: likewise resumable)

A second signal while the first is being handled restores the default action and re-delivers it, so
a stuck save can still be killed with a second Ctrl-C.

Multi-process runs: each process may see its signal at a different step, so the decision to stop is
an all-reduce (max) of the local requests, taken at the steps where the loop syncs anyway (log and
checkpoint steps); every process then saves the same step.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import numpy as np

EXIT_SIGTERM = 128 + signal.SIGTERM  # 143
EXIT_SIGINT = 128 + signal.SIGINT  # 130
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_requested = threading.Event()
_signum: int | None = None
_depth = 0
_previous: dict[int, object] = {}


def _handler(signum: int, frame: FrameType | None) -> None:
    global _signum
    if _requested.is_set():  # second signal: stop waiting for the save, die the default way
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
        return
    _signum = signum
    _requested.set()
    # os.write, not print: a handler that prints while the main thread is inside a buffered write
    # raises "reentrant call" RuntimeError.
    msg = (f"[dlr_jax] {signal.Signals(signum).name}: saving at the next step boundary, then exiting "
           f"with code {128 + signum} (a second signal kills at once)\n")
    os.write(2, msg.encode())


@contextmanager
def handling_signals() -> Iterator[None]:
    """Within this block SIGTERM/SIGINT set the stop request instead of killing the process.
    Re-entrant (a training loop inside the CLI's block); only the main thread can install handlers,
    elsewhere this is a no-op and the request can still be made with `request_stop()`."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth == 0:
        for s in SIGNALS:
            _previous[s] = signal.signal(s, _handler)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            for s in SIGNALS:
                signal.signal(s, _previous.pop(s))  # type: ignore[arg-type]


def request_stop(signum: int = signal.SIGTERM) -> None:
    """What the signal handler does (for callers that are not the main thread, and tests)."""
    global _signum
    _signum = signum
    _requested.set()


def requested() -> bool:
    """This process has been asked to stop (not yet agreed with the other processes)."""
    return _requested.is_set()


def should_stop(sync: bool = True) -> bool:
    """Whether the loop stops now. Single process: the local request. Several processes: the max
    over all processes, computed only when `sync` is true (a step where every process syncs anyway);
    otherwise False, so that no process stops alone."""
    import jax

    if jax.process_count() == 1:
        return _requested.is_set()
    if not sync:
        return False
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.int32(_requested.is_set()))
    agreed = bool(np.max(votes))
    if agreed and not _requested.is_set():  # another process was signalled: exit like it does
        request_stop()
    return agreed


def exit_code() -> int:
    """128 + the signal that asked to stop (143 SIGTERM, 130 SIGINT); 0 when none did."""
    if not _requested.is_set():
        return 0
    return 128 + (_signum or signal.SIGTERM)


def reset() -> None:
    """Forget a stop request (tests that preempt in-process, then train again)."""
    global _signum
    _signum = None
    _requested.clear()
