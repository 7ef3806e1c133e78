"""dlr_jax/files.py: a file rewritten while other processes read it is never seen empty or half
written (the multi-process race behind a JSONDecodeError on the sft dual-branch marker)."""

from __future__ import annotations

import os

import pytest

from dlr_jax.files import atomic_path, write_text_atomic


def test_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text("old: 1\n")
    assert write_text_atomic(f, "new: 2\n") == f
    assert f.read_text() == "new: 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_readers_see_the_old_file_until_the_new_one_is_whole(tmp_path):
    f = tmp_path / "marker.json"
    f.write_text('{"on": false}\n')
    with atomic_path(f) as tmp:
        tmp.write_text('{"on": ')  # half written: a reader of `f` must not see this
        assert f.read_text() == '{"on": false}\n'
        with open(tmp, "a") as fh:
            fh.write("true}\n")
        assert f.read_text() == '{"on": false}\n'
    assert f.read_text() == '{"on": true}\n'


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    f = tmp_path / "meta.json"
    f.write_text("{}")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(f) as tmp:
        tmp.write_text('{"half')
        raise RuntimeError("disk full")
    assert f.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json"]


def test_temporary_names_differ_between_processes(tmp_path):
    """Two processes writing one file at once must not share (and truncate) one temporary."""
    with atomic_path(tmp_path / "x") as tmp:
        assert str(os.getpid()) in tmp.name and tmp.parent == tmp_path
        tmp.write_text("x")
