"""MathX-5M: its reader (parquet shards and JSONL, on records written here), the stratified sample it draws while
reading, the codebook corpus mixture ("name:split@N") and its record, and the download entry (never fetched)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.data import load_benchmark, protocol
from dlr_jax.data.mathx import count_rows, read_mathx, solution_cot
from dlr_jax.data.records import DataFormatError
from dlr_jax.data.sources import CorpusEntry, corpus, load_corpus_entry

ROOT = Path(__file__).resolve().parents[2]


def _record(i: int, question_field: str = "problem") -> dict:
    return {question_field: f"What is {i} + {i}?", "generated_solution": f"<think>\n{i} + {i} = {2 * i}\n</think>\n"
            f"The answer is $\\boxed{{{2 * i}}}$.", "expected_answer": str(2 * i)}


def _release(root: Path, sizes=(7, 5, 3)) -> Path:
    """A MathX-like folder: data/MathX-<n>.parquet, the first file with `question`, the others with `problem`."""
    data = root / "mathx_5m" / "data"
    data.mkdir(parents=True)
    start = 0
    for n, size in enumerate(sizes):
        rows = [_record(start + i, "question" if n == 0 else "problem") for i in range(size)]
        pq.write_table(pa.Table.from_pylist(rows), data / f"MathX-{n}.parquet")
        start += size
    return root / "mathx_5m"


def test_records_become_examples_with_the_think_tags_taken_out(tmp_path):
    f = tmp_path / "part.jsonl"
    f.write_text("\n".join(json.dumps(_record(i, "question" if i else "problem")) for i in range(3)) + "\n")
    exs = read_mathx(f)
    assert [e.id for e in exs] == ["mathx_5m/part/0", "mathx_5m/part/1", "mathx_5m/part/2"]
    assert exs[1].question == "What is 1 + 1?" and exs[1].answer == "2" and exs[1].extra["stratum"] == "part"
    assert exs[1].cot == "1 + 1 = 2\nThe answer is $\\boxed{2}$." and "<think>" not in exs[1].cot
    assert solution_cot("no tags here") == "no tags here"
    f.write_text(json.dumps(_record(0)) + "\n" + json.dumps({"problem": "P", "expected_answer": "1"}) + "\n")
    with pytest.raises(DataFormatError, match=r"part.jsonl:2: field 'generated_solution' should be a string"):
        read_mathx(f)
    f.write_text(json.dumps({"prompt": "P", "generated_solution": "S", "expected_answer": "1"}) + "\n")
    with pytest.raises(DataFormatError, match=r"part.jsonl:1: no problem text.*'prompt'"):
        read_mathx(f)


def test_parquet_shards_read_whole_and_sampled_as_the_generic_stratified_sample(tmp_path):
    release = _release(tmp_path)
    every = load_benchmark("mathx_5m", path=release)  # a folder laid out like the release: data/*.parquet
    assert len(every) == 15 == count_rows(release) and every[0].id == "mathx_5m/MathX-0/0"
    assert every[0].question == "What is 0 + 0?" and every[9].question == "What is 9 + 9?"  # question | problem
    sampled = read_mathx(release / "data", sample=6, seed=3)
    # read file by file without the whole release in memory, and the same as sampling it whole
    assert sampled == protocol.stratified_sample(every, 6, seed=3)
    per_file = {s: sum(e.extra["stratum"] == s for e in sampled) for s in ("MathX-0", "MathX-1", "MathX-2")}
    assert per_file == {"MathX-0": 3, "MathX-1": 2, "MathX-2": 1}  # 6 x (7, 5, 3) / 15 = 2.8, 2, 1.2
    assert read_mathx(release / "data", sample=6, seed=4) != sampled
    with pytest.raises(protocol.SampleTooLarge, match="a sample of 16 asked of 15 MathX-5M records"):
        read_mathx(release / "data", sample=16)
    bad = release / "data" / "MathX-9.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(DataFormatError, match="MathX-9.parquet: not a readable parquet file"):
        read_mathx(release / "data")


def test_allocation_is_proportional_and_sums_to_n():
    assert protocol.allocate({"a": 7, "b": 5, "c": 3}, 6) == {"a": 3, "b": 2, "c": 1}
    assert protocol.allocate({"a": 1, "b": 1}, 1) == {"a": 1, "b": 0}  # ties by name
    assert sum(protocol.allocate({"x": 385_620, "y": 12_000}, 1000).values()) == 1000
    with pytest.raises(protocol.SampleTooLarge):
        protocol.allocate({"a": 2}, 3)


@pytest.fixture
def data_root(tmp_path, data_dir, monkeypatch):
    """A data root with the shared GSM8K-Aug and MATH files and a small MathX release."""
    root = tmp_path / "root"
    root.mkdir()
    for sub in ("gsm8k_aug", "math_train", "math500"):
        (root / sub).symlink_to(data_dir / sub)
    _release(root)
    monkeypatch.setenv("DLR_DATA_DIR", str(root))
    return root


def test_the_corpus_mixes_sources_with_sample_sizes_and_says_what_it_read(data_root):
    assert CorpusEntry.parse("mathx_5m:train@603_000") == CorpusEntry("mathx_5m", "train", 603_000)
    for bad in ("mathx_5m", "mathx_5m:train@", "mathx_5m:train@0", "mathx_5m:train@1e5"):
        with pytest.raises(ConfigError, match="must look like name:split or name:split@N"):
            CorpusEntry.parse(bad)
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [
        "codebook.corpus=[gsm8k_aug:train_subset_3000@100, math_train:train, mathx_5m:train@6]"])
    texts, info = corpus(cfg)
    got = {s["entry"]: s for s in info["sources"]}
    assert got["gsm8k_aug:train_subset_3000@100"]["available"] == 3000
    assert [got[e]["taken"] for e in got] == [100, 12000, 6] and got["mathx_5m:train@6"]["sample_seed"] == 0
    assert "available" not in got["mathx_5m:train@6"]  # drawn while reading: the release is never held whole
    assert info["texts"] == len(texts) == 100 + 12000 + 6 - info["empty_cot_left_out"]
    again = corpus(load_config(ROOT / "configs" / "tiny.yaml", [
        "codebook.corpus=[gsm8k_aug:train_subset_3000@100, math_train:train, mathx_5m:train@6]",
        "data.split_seed=1"]))[1]
    assert again["sources"][0]["ids_sha256"] != got["gsm8k_aug:train_subset_3000@100"]["ids_sha256"]
    # a count meant for the full release, on a smaller copy: one line naming the entry
    with pytest.raises(ConfigError, match=r"mathx_5m:train@603000: .*a sample of 603,000 asked of 15"):
        load_corpus_entry(CorpusEntry.parse("mathx_5m:train@603000"))
    with pytest.raises(ConfigError, match=r"gsm8k_aug:train_subset_3000@4000: a sample of 4,000 asked of 3,000"):
        load_corpus_entry(CorpusEntry.parse("gsm8k_aug:train_subset_3000@4000"))


def test_the_codebook_stage_records_its_corpus(data_root, tmp_path, monkeypatch):
    from dlr_jax.stages import common
    from dlr_jax.stages.codebook import stage

    def _stop(cfg):
        raise KeyboardInterrupt  # the record is written before the mesh: nothing is trained

    monkeypatch.setattr(common, "make_mesh_for", _stop)
    sets = ["codebook.corpus=[math_train:train@20, mathx_5m:train@6]", "codebook.eval_corpus=[math500:test]"]
    w = tmp_path / "w"
    with pytest.raises(KeyboardInterrupt):
        stage.run(load_config(ROOT / "configs" / "tiny.yaml", sets), w)
    rec = json.loads((w / "codebook" / stage.CORPUS_FILE).read_text())
    assert [s["taken"] for s in rec["sources"]] == [20, 6] and rec["texts"] == 26
    with pytest.raises(ValueError, match=r"differs from the recorded one in \['sources', 'texts'\]"):
        stage.run(load_config(ROOT / "configs" / "tiny.yaml", ["codebook.corpus=[math_train:train@21]", sets[1]]), w)


def test_the_download_entry_names_the_hub_and_records_the_commit(tmp_path, monkeypatch):
    """Nothing is fetched: the hub client is replaced by one that writes a small release."""
    import huggingface_hub

    from dlr_jax.data import download as dl

    src = dl.HUB_SOURCES["mathx_5m"]
    assert src.repo == "XenArcAI/MathX-5M" and src.pattern == "data/*.parquet" and "mathx_5m" not in dl.DEFAULT_ALL
    calls = []

    class Api:
        def dataset_info(self, repo, revision):
            calls.append(("info", repo, revision))
            return type("Info", (), {"sha": "c" * 40})()

    def snapshot(**kw):
        calls.append(("snapshot", kw["repo_id"], kw["revision"], kw["allow_patterns"], kw["repo_type"]))
        _release(tmp_path / "fake")
        (Path(kw["local_dir"]) / "data").mkdir(parents=True)
        for f in (tmp_path / "fake" / "mathx_5m" / "data").iterdir():
            (Path(kw["local_dir"]) / "data" / f.name).write_bytes(f.read_bytes())

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    lines = []
    got = dl.download(["mathx_5m"], tmp_path / "out", log=lines.append)
    assert calls == [("info", "XenArcAI/MathX-5M", "main"),
                     ("snapshot", "XenArcAI/MathX-5M", "c" * 40, ["data/*.parquet"], "dataset")]
    rec = json.loads((got["mathx_5m"] / dl.SOURCE_RECORD).read_text())
    assert rec["commit"] == "c" * 40 and rec["rows"] == 15 and "15 records, commit cccc" in lines[-1]
    assert len(load_benchmark("mathx_5m", path=got["mathx_5m"])) == 15
    dl.download(["mathx_5m"], tmp_path / "out", log=lines.append)
    assert "present" in lines[-1] and len(calls) == 2  # not fetched again
    # a local copy laid out like --to is copied, never fetched
    dl.download(["mathx_5m"], tmp_path / "copy", base_url=(tmp_path / "out").as_uri(), log=lines.append)
    assert json.loads((tmp_path / "copy" / "mathx_5m" / dl.SOURCE_RECORD).read_text())["rows"] == 15
    with pytest.raises(dl.DownloadError, match="must be a local folder"):
        dl.download(["mathx_5m"], tmp_path / "x", base_url="https://example.org/mirror", log=lines.append)
