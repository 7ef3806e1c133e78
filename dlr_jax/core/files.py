"""Files that another process may read while this one writes them.

In a multi-process run every rank reads the workdir's shared files (config.yaml, the tokenizer, the
sft dual-branch marker, checkpoint meta.json) while process 0 rewrites them at its own pace; a plain
`write_text` truncates first, so a reader can see an empty or half-written file. These helpers write
under a temporary name in the same directory and rename: a reader sees the old file or the new one."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

# The temporary names atomic_path gives: `.{name}.{host}.{pid}.{random}.tmp`. A host name may hold dots, so the
# first group is name and host together (`run.workdir.remove_stale_temps` compares its end with this host's name).
TEMP_NAME = re.compile(r"^\.(?P<name_host>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path`; when the block ends without an error, renames it onto
    `path` (os.replace is atomic on POSIX). On an error the temporary file is removed, `path` untouched.

    The result is a new file: it has the default mode, and a symlink at `path` is replaced, not written
    through. Write to the yielded path itself (`open(tmp, "wb")`): writers that add a suffix to a
    name they are given (np.save) would miss it."""
    dest = Path(path)
    # Host, pid and a random part: writers on hosts sharing a filesystem may have equal pids.
    tmp = dest.with_name(f".{dest.name}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """`Path(path).write_text(text)`, but readers never see a partial file."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


class MissingStageError(FileNotFoundError):
    """An input that an earlier command writes is not there (a stage's final model, the exported latent ids, a
    workdir's config): the message names the command that makes it. The CLIs print it as one error line (exit 2);
    any other missing file keeps its traceback."""
