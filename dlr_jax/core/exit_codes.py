"""The exit codes of the command-line tools, in one place (README "Runs on a cluster: exit codes").

    0    done
    1    any other failure: a traceback
    2    refused: a bad config or input, a missing or unreadable earlier output, a locked workdir; one `error:` line
    75   EX_TEMPFAIL (sysexits.h): a write failed because the file system is full (ENOSPC) or the quota is spent
         (EDQUOT). What was saved before the failed write is intact (checkpoints are written to a temporary name
         and renamed), so rerunning the same command after freeing space resumes; one `error:` line says what could
         not be written, where, and how much space is free
    130  SIGINT (128 + 2), 143 SIGTERM (128 + 15): stopped after saving (preemption.py)

A scheduler can requeue on 75, 130 and 143 (the run resumes), and should not on 1 or 2 (it would fail the same way).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from dlr_jax.core.preemption import EXIT_SIGINT, EXIT_SIGTERM

OK = 0
FAILED = 1
REFUSED = 2
NO_SPACE = 75  # EX_TEMPFAIL
STOPPED_SIGINT = EXIT_SIGINT
STOPPED_SIGTERM = EXIT_SIGTERM

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# TensorStore (Orbax's writer) raises ValueError("RESOURCE_EXHAUSTED: ... No space left on device
# [os_error_code='28']"): the errno survives only as text.
_NO_SPACE_TEXT = re.compile("|".join([*(re.escape(os.strerror(e)) for e in NO_SPACE_ERRNOS),
                                      *(rf"os_error_code='{e}'" for e in NO_SPACE_ERRNOS)]))
_QUOTED_PATH = re.compile(r'"(/[^"]+)"')
# Orbax writes a checkpoint under `<dir>.orbax-checkpoint-tmp...` and renames it when complete.
_ORBAX_TMP = re.compile(r"\.orbax-checkpoint-tmp.*$")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what led to it (causes, contexts, the errors of exception groups), outer before inner."""
    queue: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while queue:
        e = queue.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        queue += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]


def _says_no_space(e: BaseException) -> bool:
    return (isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS) or mentions_no_space(str(e))


def no_space_error(exc: BaseException) -> BaseException | None:
    """The error in `exc`'s chain (causes, contexts, exception groups) that says the disk is full or the quota
    spent, else None."""
    return next((e for e in _chain(exc) if _says_no_space(e)), None)


def mentions_no_space(text: str) -> bool:
    """Whether an error message says the disk is full or the quota spent."""
    return _NO_SPACE_TEXT.search(text) is not None


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # not reached


def _written_path(err: BaseException) -> str | None:
    """The file `err` failed to write: its filename, a path its message quotes (TensorStore's), or, for a write that
    names none (`f.write` in a buffered writer), a path or open file among the locals of the frames that raised it."""
    if isinstance(err, OSError) and err.filename is not None:
        return str(err.filename)
    if m := _QUOTED_PATH.search(str(err)):
        return _ORBAX_TMP.sub("", m.group(1))  # the checkpoint being written, not Orbax's temporary name of it
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames[-3:]):  # innermost first
        for value in frame.f_locals.values():
            name = value if isinstance(value, os.PathLike) else getattr(value, "name", None)
            if isinstance(name, str | os.PathLike) and os.path.isabs(name):
                return _ORBAX_TMP.sub("", os.fspath(name))
    return None


def no_space_message(exc: BaseException, where: str | os.PathLike) -> str:
    """One line for a write that failed for want of space (`exc`: the error a command caught): what could not be
    written (the first failed write of `exc`'s chain that names its file, else `where`), the free space on its file
    system, and that resuming is safe."""
    errors = [e for e in _chain(exc) if _says_no_space(e)] or [exc]
    what = next((p for e in reversed(errors) if (p := _written_path(e)) is not None), None)  # the first to fail
    target = Path(what) if what is not None else Path(where)
    try:
        free = _size(shutil.disk_usage(_existing(target.absolute())).free) + " free"
    except OSError:
        free = "free space unknown"
    quota = any((isinstance(e, OSError) and e.errno == errno.EDQUOT) or os.strerror(errno.EDQUOT) in str(e)
                for e in errors)
    cause = "disk quota exceeded" if quota else "no space left on device"
    return (f"{cause}: could not write {target} ({free} there). Everything saved before this write is intact (the "
            f"last checkpoint, the stages before); free space and rerun the same command to resume "
            f"(exit code {NO_SPACE})")
