"""dlr_jax/core/files.py: a file rewritten while other processes read it is never seen empty or half
written (the multi-process race behind a JSONDecodeError on the sft dual-branch marker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlr_jax.core.files import atomic_path, write_text_atomic


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


def test_the_files_other_processes_read_go_through_the_rename(tmp_path, monkeypatch):
    """config.yaml, the tokenizer, data_protocol.json and checkpoint meta.json: a plain write here
    would reopen the race (another rank reading a truncated file)."""
    import dlr_jax.core.files as files
    from dlr_jax.config import load_config, save_config
    from dlr_jax.data import protocol
    from dlr_jax.text.tokens import train_bpe

    renamed: list[str] = []
    real = files.os.replace
    monkeypatch.setattr(files.os, "replace", lambda a, b: (renamed.append(Path(b).name), real(a, b)))
    save_config(load_config(Path(__file__).parents[2] / "configs" / "tiny.yaml"), tmp_path / "config.yaml")
    train_bpe(["Sam has 4 coins. <<4+9=13>> 13"] * 4, 300, num_latents=4, pad_multiple=64).save(tmp_path / "tok")
    protocol.record(tmp_path, {"examples": 1})
    assert renamed == ["config.yaml", "dlr_tokens.json", "tokenizer.json", protocol.PROTOCOL_FILE]
