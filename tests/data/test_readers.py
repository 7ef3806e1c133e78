import logging
import shutil

import pytest

from dlr_jax.data import BENCHMARKS, NAMES, load_benchmark
from dlr_jax.data.readers import benchmark_file, filter_examples

DEFAULT_COUNTS = {
    "gsm8k": 1319,
    "gsm8k_aug": 1319,
    "gsm_hard": 1319,
    "svamp": 1000,
    "multiarith": 600,
    "math500": 500,
    "math_train": 12000,
}


def test_names():
    # mathx_5m: a codebook corpus source not in the shared data (tests/data/test_mathx.py)
    assert set(NAMES) == {*DEFAULT_COUNTS, "synthetic", "synthetic_hard", "synthetic_reworded", "mathx_5m"}


@pytest.mark.parametrize("name", sorted(DEFAULT_COUNTS))
def test_default_split_counts(data_dir, name):
    exs = load_benchmark(name)
    assert len(exs) == DEFAULT_COUNTS[name] == BENCHMARKS[name].counts[BENCHMARKS[name].default_split]
    assert all(ex.source == name for ex in exs)
    assert all(ex.question for ex in exs)


def test_explicit_splits(data_dir):
    assert len(load_benchmark("gsm8k", split="train")) == 7473
    assert len(load_benchmark("gsm8k_aug", split="valid")) == 500
    assert len(load_benchmark("multiarith", split="test")) == 180
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        load_benchmark("gsm8k", split="dev")
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'"):
        load_benchmark("gsm9k")


def test_user_copy_as_file_and_dir(data_dir, tmp_path):
    src = data_dir / "svamp" / "SVAMP.json"
    copy = tmp_path / "mine.json"
    shutil.copy(src, copy)
    assert load_benchmark("svamp", path=copy) == load_benchmark("svamp")
    (tmp_path / "g").mkdir()
    shutil.copy(data_dir / "gsm8k" / "test.jsonl", tmp_path / "g" / "test.jsonl")
    assert len(load_benchmark("gsm8k", path=tmp_path / "g")) == 1319
    with pytest.raises(FileNotFoundError, match=r"gsm8k \(train\).*does not exist.*download gsm8k"):
        load_benchmark("gsm8k", path=tmp_path / "g", split="train")


def test_gsm8k_aug_train_falls_back_to_subset_loudly(data_dir, tmp_path):
    d = tmp_path / "aug"
    d.mkdir()
    shutil.copy(data_dir / "gsm8k_aug" / "train_subset_3000.txt", d)
    with pytest.warns(UserWarning, match="using the 3,000-line subset"):
        exs = load_benchmark("gsm8k_aug", path=d, split="train")
    assert len(exs) == 3000 and exs[0].id == "gsm8k_aug/train_subset_3000/0"
    (d / "train.txt").write_text("Q||<<1+1=2>> #### 2\n")
    assert [e.answer for e in load_benchmark("gsm8k_aug", path=d, split="train")] == ["2"]
    assert benchmark_file("gsm8k_aug", "train", d) == d / "train.txt"


def test_reader_options_pass_through(data_dir):
    [first] = load_benchmark("gsm8k", split="train", cot="natural")[:1]
    assert first.cot.startswith("Natalia sold 48/2 = 24 clips")


def test_synthetic_via_registry(tmp_path):
    test = load_benchmark("synthetic", split="test", sizes={"test": 20, "valid": 5, "train": 50}, seed=3)
    train = load_benchmark("synthetic", split="train", sizes={"test": 20, "valid": 5, "train": 50}, seed=3)
    assert (len(test), len(train)) == (20, 50)
    assert {e.question for e in test}.isdisjoint(e.question for e in train)
    from dlr_jax.data.gsm8k_aug import write_gsm8k_aug

    write_gsm8k_aug(test, tmp_path / "test.txt")
    back = load_benchmark("synthetic", path=tmp_path, split="test")
    assert [(e.question, e.cot, e.answer) for e in back] == [(e.question, e.cot, e.answer) for e in test]


def test_filter_reports_count(data_dir, caplog):
    exs = load_benchmark("gsm8k", split="train")
    with caplog.at_level(logging.INFO):
        kept, dropped = filter_examples(exs, lambda e: bool(e.cot), reason="no calculator annotations")
    assert dropped == 95 and len(kept) == len(exs) - 95
    assert "dropped 95 of 7473 examples: no calculator annotations" in caplog.text


def test_a_directory_where_the_data_file_is_expected_is_said_in_one_line(tmp_path, capsys):
    """It was a traceback saying the file "does not exist" (exit 1)."""
    from dlr_jax import train
    from dlr_jax.data.records import DataFormatError
    from tests.cli_micro import micro_yaml

    (tmp_path / "g" / "test.jsonl").mkdir(parents=True)  # a copy unpacked one level too deep
    with pytest.raises(DataFormatError, match=r"g/test.jsonl: is a directory; gsm8k \(test\) reads a file here"):
        load_benchmark("gsm8k", path=tmp_path / "g")
    (tmp_path / "s" / "train.txt").mkdir(parents=True)
    with pytest.raises(DataFormatError, match=r"s/train.txt: is a directory; synthetic \(train\) reads a file here"):
        load_benchmark("synthetic", path=tmp_path / "s", split="train")
    cfg = micro_yaml(tmp_path / "m.yaml", ["data.dataset=gsm8k_aug", f"data.path={tmp_path / 's'}"])
    code = train.main(["--stage", "textsft", "--config", str(cfg), "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == f"error: {tmp_path / 's' / 'train.txt'}: is a directory; gsm8k_aug (train) reads " \
                                    "a file here", err
    assert "Traceback" not in "\n".join(err)
