"""A full disk or a spent quota is found wherever it hides in an exception, and said in one line."""

from __future__ import annotations

import errno
import os

from dlr_jax.core.exit_codes import NO_SPACE, REFUSED, no_space_error, no_space_message


def _enospc(path="/x/metrics.jsonl"):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def test_codes():
    assert (NO_SPACE, REFUSED) == (75, 2)


def test_no_space_is_found_in_causes_contexts_groups_and_tensorstore_text():
    assert no_space_error(_enospc()) is not None
    assert no_space_error(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))) is not None
    try:
        try:
            raise _enospc()
        except OSError as inner:
            raise RuntimeError("writing failed") from inner
    except RuntimeError as e:
        assert no_space_error(e).errno == errno.ENOSPC
    try:
        try:
            raise _enospc()
        except OSError:
            raise KeyError("while handling it") from None
    except KeyError as e:  # `from None` hides the context from tracebacks, not from the chain
        assert no_space_error(e) is not None
    group = Exception("save")  # an ExceptionGroup (Python 3.11+): its errors are in `exceptions`
    group.exceptions = (ValueError("x"), _enospc())
    assert no_space_error(group) is not None
    # Orbax's writer (TensorStore) keeps the errno as text only
    ts = ValueError('RESOURCE_EXHAUSTED: Error writing local file "/w/s/checkpoints/4.orbax-checkpoint-tmp-17/'
                    '_sharding": Failed to write 3280 bytes to file 5: No space left on device [os_error_code=\'28\']')
    assert no_space_error(RuntimeError("save")) is None
    assert no_space_error(ts) is ts
    assert no_space_error(OSError(errno.EACCES, "Permission denied")) is None


def test_the_line_names_the_file_the_free_space_and_that_resuming_is_safe(tmp_path):
    line = no_space_message(_enospc(str(tmp_path / "stage" / "metrics.jsonl")), tmp_path)
    assert line.startswith(f"no space left on device: could not write {tmp_path / 'stage' / 'metrics.jsonl'} (")
    assert " free there)" in line and "rerun the same command to resume (exit code 75)" in line
    assert "\n" not in line
    ts = ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{tmp_path}/checkpoints/4.orbax-checkpoint-tmp-9/'
                    "_sharding\": No space left on device [os_error_code='28']")
    assert f"could not write {tmp_path}/checkpoints/4 (" in no_space_message(ts, tmp_path)  # not Orbax's temp name
    quota = no_space_message(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), tmp_path)
    assert quota.startswith(f"disk quota exceeded: could not write {tmp_path} (")


def test_the_first_failed_write_is_named_not_a_flush_that_failed_after_it(tmp_path):
    """A checkpoint write fails, then the metrics writer's close (in a `finally`) fails to flush: the line names the
    checkpoint."""
    ckpt = tmp_path / "checkpoints" / "4"
    try:
        try:
            raise ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{ckpt}.orbax-checkpoint-tmp/_sharding": '
                             "No space left on device [os_error_code='28']")
        finally:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a buffered flush names no file
    except OSError as e:
        assert f"could not write {ckpt} (" in no_space_message(e, tmp_path)


def test_a_write_that_names_no_file_is_told_by_the_file_it_was_writing(tmp_path):
    def flush(fh):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with open(tmp_path / "events.out", "w") as fh:
        try:
            flush(fh)
        except OSError as e:
            line = no_space_message(e, tmp_path / "elsewhere")
    assert f"could not write {tmp_path / 'events.out'} (" in line
