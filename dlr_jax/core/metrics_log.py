"""What a training run writes as it goes: metrics.jsonl and TensorBoard rows (trimmed on resume), the
progress bar, and the profiler window's checks."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.core.files import write_text_atomic


def profile_window_problem(prof: tuple[int, int], start: int, total: int) -> str | None:
    """Why the profile window [a, b) will not be traced in a run from step `start` to `total`, if so."""
    a, b = prof
    if a < start:
        return (f"profile_steps {a}:{b} starts before the resume step {start}: nothing will be traced "
                f"(choose a window after step {start})")
    if a >= total:
        return f"profile_steps {a}:{b} starts at or after the last step {total}: nothing will be traced"
    if b > total:
        return f"profile_steps {a}:{b} ends after the last step {total}: the trace stops at step {total}"
    return None


class ProfileWindow:
    """`jax.profiler` over the steps of `profile_steps` "a:b" of a loop: the trace starts before step a + 1 and
    stops after step b (the Trainer's loop and the RL loop share it). `before(done)` / `after(done)` take the
    number of steps done so far; a window the run cannot reach is a printed warning, not an error."""

    def __init__(self, spec: str, out_dir: Path, name: str, start: int, total: int) -> None:
        self.prof, self.out_dir, self.name, self.tracing = parse_profile(spec), out_dir, name, False
        if self.prof and (msg := profile_window_problem(self.prof, start, total)):
            print(f"[{name}] warning: {msg}", flush=True)

    def before(self, done: int) -> None:
        if self.prof and done == self.prof[0]:
            import jax

            jax.profiler.start_trace(str(self.out_dir))
            self.tracing = True

    def after(self, done: int) -> None:
        if self.tracing and self.prof and done == self.prof[1]:
            self.close()
            print(f"[{self.name}] profile of steps {self.prof[0]}:{self.prof[1]} in {self.out_dir}", flush=True)

    def close(self) -> None:
        if self.tracing:
            import jax

            jax.profiler.stop_trace()
            self.tracing = False


def jsonable(x: Any) -> Any:
    if isinstance(x, bytes):
        return {"__bytes__": x.decode("latin-1")}
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def parse_profile(spec: str) -> tuple[int, int] | None:
    if not spec:
        return None
    a, _, b = spec.partition(":")
    try:
        lo, hi = int(a), int(b)
    except ValueError:
        raise ValueError(f"profile_steps must look like 'a:b' (e.g. 10:15), got {spec!r}") from None
    if hi <= lo:
        raise ValueError(f"profile_steps {spec!r}: end must be after start")
    return lo, hi


def _drop(path: Path, drop: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrites metrics.jsonl without the rows `drop` picks; returns how many."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    keep = [ln for ln in lines if not ln.strip() or not drop(json.loads(ln))]
    if len(keep) != len(lines):
        write_text_atomic(path, "".join(keep))  # a kill here leaves the old or the new file, never half
    return len(lines) - len(keep)


def truncate_metrics(path: Path, after_step: int) -> int:
    """Drops the rows of `path` (metrics.jsonl) whose step is > `after_step`; returns how many. A run
    that resumes from step s redoes the steps after s, so their old rows would repeat."""
    return _drop(path, lambda row: row.get("step", 0) > after_step)


def drop_rows(path: Path, step: int, prefix: str) -> int:
    """Drops the rows of `path` at `step` that hold a key starting with `prefix` (e.g. an evaluation the run
    is about to log again); returns how many."""
    return _drop(path, lambda row: row.get("step") == step and any(k.startswith(prefix) for k in row))


class MetricsWriter:
    """`<root>/metrics.jsonl` (one JSON row a step) and TensorBoard events, written by process 0 only."""

    def __init__(self, root: Path, enabled: bool, resume_step: int | None = None):
        """resume_step: the step this run starts from; later rows in metrics.jsonl are dropped, and TensorBoard
        is told to drop the earlier events files' (-1: the run logs step 0 again, e.g. RL's first evaluation)."""
        self.enabled = enabled
        if enabled and resume_step is not None:
            truncate_metrics(root / "metrics.jsonl", resume_step)
        self.jsonl = open(root / "metrics.jsonl", "a") if enabled else None
        self.tb = None
        if enabled:
            try:
                from tensorboardX import SummaryWriter

                # The same steps as metrics.jsonl: TensorBoard hides an older events file's steps from here on.
                purge = None if resume_step is None else resume_step + 1
                self.tb = SummaryWriter(str(root / "events"), purge_step=purge)
            except ImportError:  # TensorBoard is optional; metrics.jsonl always exists
                self.tb = None

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, **{k: v for k, v in metrics.items() if k != "step"}}) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if k != "step":
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.jsonl:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()


def progress(total: int, initial: int, enabled: bool, name: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=name, dynamic_ncols=True, mininterval=1.0)
