import dataclasses
import hashlib
import re

import pytest

from dlr_jax.data import download as dl


def one(name: str) -> dl.FileSource:
    [src] = dl.SOURCES[name]
    return src


def test_sources_are_pinned_commits():
    for srcs in dl.SOURCES.values():
        for s in srcs:
            assert s.url.startswith(
                ("https://raw.githubusercontent.com/", "https://media.githubusercontent.com/")
            )
            assert re.search(r"/[0-9a-f]{40}/", s.url), s.url
            assert s.count == dl.BENCHMARKS[s.benchmark].counts[s.split]


def test_local_mirror_verifies_hash_and_count(data_dir, tmp_path):
    lines = []
    got = dl.download(["svamp", "multiarith"], tmp_path, base_url=data_dir.as_uri(), log=lines.append)
    assert (tmp_path / "svamp" / "SVAMP.json").read_bytes() == (
        data_dir / "svamp" / "SVAMP.json"
    ).read_bytes()
    assert set(got) == {"svamp/SVAMP.json", "multiarith/MultiArith.json"}
    assert any("svamp/SVAMP.json: 1000 records (expected 1000), sha256 ok" in s for s in lines)
    lines.clear()
    dl.download(["svamp"], tmp_path, base_url=data_dir.as_uri(), log=lines.append)
    assert "present, 1000 records" in lines[0]


def test_upstream_hash_mismatch_is_fatal(data_dir, tmp_path, monkeypatch):
    src = dataclasses.replace(one("svamp"), url=(data_dir / "svamp" / "SVAMP.json").as_uri(), sha256="0" * 64)
    with pytest.raises(dl.DownloadError, match="does not match the pinned"):
        dl.download_file(src, tmp_path, log=lambda s: None)
    assert not (tmp_path / "svamp" / "SVAMP.json").exists()
    assert list((tmp_path / "svamp").iterdir()) == [], "no partial file left behind"
    good = hashlib.sha256((data_dir / "svamp" / "SVAMP.json").read_bytes()).hexdigest()
    ok = dataclasses.replace(src, sha256=good[:8] + "..." + good[-4:])
    assert dl.download_file(ok, tmp_path, log=lambda s: None).is_file()


def test_count_mismatch_and_lfs_pointer(tmp_path):
    mirror = tmp_path / "mirror" / "gsm_hard"
    mirror.mkdir(parents=True)
    (mirror / "gsmhardv2.jsonl").write_text('{"input": "Q", "code": "", "target": 1.0}\n')
    base = (tmp_path / "mirror").as_uri()
    with pytest.raises(dl.DownloadError, match="1 records, expected 1319"):
        dl.download(["gsm_hard"], tmp_path / "out", base_url=base, log=lambda s: None)
    (mirror / "gsmhardv2.jsonl").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n"
    )
    with pytest.raises(dl.DownloadError, match="Git LFS pointer"):
        dl.download(["gsm_hard"], tmp_path / "out", base_url=base, log=lambda s: None)


def test_bad_record_in_download_names_line(tmp_path):
    mirror = tmp_path / "m" / "gsm8k_aug"
    mirror.mkdir(parents=True)
    (mirror / "valid.txt").write_text("Q||<<1+1=2>> #### 2\nbroken line\n")
    # The source's URL and line, not the temporary .part file, which is deleted before the message is read.
    url = (mirror / "valid.txt").as_uri()
    with pytest.raises(dl.DownloadError, match=rf"^{re.escape(url)}:2: expected exactly one '\|\|'"):
        dl.download(["gsm8k_aug"], tmp_path / "out", base_url=(tmp_path / "m").as_uri(), log=lambda s: None)


def test_a_damaged_copy_at_the_destination_is_fetched_anew(data_dir, tmp_path):
    dest = tmp_path / "gsm8k" / "test.jsonl"
    dest.parent.mkdir()
    dest.write_bytes((data_dir / "gsm8k" / "test.jsonl").read_bytes()[:5000])  # cut mid-line, as a failed copy
    lines = []
    dl.download_file(dl.SOURCES["gsm8k"][1], tmp_path, base_url=data_dir.as_uri(), log=lines.append)
    assert dest.read_bytes() == (data_dir / "gsm8k" / "test.jsonl").read_bytes()
    assert re.match(rf"gsm8k/test.jsonl: present but unreadable \({re.escape(str(dest))}:\d+: .*\); re-fetching",
                    lines[0])


def test_cli_from_local(data_dir, tmp_path, capsys):
    assert dl.main(["gsm8k", "--to", str(tmp_path), "--from-local", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "gsm8k/train.jsonl: 7473 records (expected 7473), sha256 ok" in out
    assert "gsm8k/test.jsonl: 1319 records (expected 1319), sha256 ok" in out
    assert dl.main(["nope", "--to", str(tmp_path)]) == 1
    assert "unknown dataset 'nope'" in capsys.readouterr().err
    assert dl.main(["gsm8k_aug_full", "--to", str(tmp_path), "--mirror", (tmp_path / "x").as_uri()]) == 1
    assert "could not fetch" in capsys.readouterr().err


def test_env_mirror(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(dl.MIRROR_ENV, data_dir.as_uri())
    assert dl.main(["math500", "--to", str(tmp_path)]) == 0
    assert "math500/test.jsonl: 500 records (expected 500), sha256 ok" in capsys.readouterr().out
