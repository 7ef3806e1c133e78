"""Counts and intervals that must be positive: refused before anything is written or compiled."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.run.preflight import check_counts
from dlr_jax.training.trainer import Trainer
from tests.cli_micro import ROOT, micro_yaml, run_cli
from tests.training.test_trainer import TCFG, dataset, lm_loss, new_model

TINY = ROOT / "configs" / "tiny.yaml"


def test_tiny_config_passes():
    check_counts(load_config(TINY))


@pytest.mark.parametrize("override, named", [
    ("train.sft.num_steps=-5", "train.sft.num_steps=-5"),
    ("train.textsft.checkpoint_every=0", "train.textsft.checkpoint_every=0"),
    ("codebook.train.log_every=0", "codebook.train.log_every=0"),
    ("rl.group_size=0", "rl.group_size=0"),
    ("data.max_len=0", "data.max_len=0"),
])
def test_non_positive_counts_are_named(override, named):
    with pytest.raises(ConfigError, match=f"must be >= 1: {named}"):
        check_counts(load_config(TINY, [override]))


def test_steps_zero_is_refused_not_the_full_schedule():
    with pytest.raises(ConfigError, match="--steps 0"):
        check_counts(load_config(TINY), steps=0)


def test_trainer_refuses_a_zero_interval_before_compiling(tmp_path):
    tr = Trainer(new_model(), lm_loss, dataclasses.replace(TCFG, checkpoint_every=0), tmp_path)
    with pytest.raises(ValueError, match="checkpoint_every=0"):
        tr.fit(iter(dataset()))
    assert tr._step_fn is None  # nothing compiled
    with pytest.raises(ValueError, match="num_steps=0"):
        Trainer(new_model(), lm_loss, TCFG, tmp_path / "b").fit(iter(dataset()), num_steps=0)


@pytest.mark.parametrize("args", [["--set", "train.textsft.num_steps=-1"], ["--steps", "0"]])
def test_cli_refuses_bad_counts_and_writes_nothing(tmp_path, args):
    w = tmp_path / "w"
    out = run_cli(["--stage", "textsft", "--config", str(micro_yaml(tmp_path / "m.yaml")), "--workdir", str(w),
                   *args])
    assert out.returncode == 2, out.stdout + out.stderr
    assert "must be >= 1" in out.stderr
    assert not w.exists()


def test_cli_refuses_the_direct_from_cot_control_outside_textsft(tmp_path):
    w = tmp_path / "w"
    out = run_cli(["--stage", "all", "--mode", "direct_from_cot", "--config", str(micro_yaml(tmp_path / "m.yaml")),
                   "--workdir", str(w)])
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--mode direct_from_cot is a textsft control" in out.stderr
    assert not w.exists()


def test_cli_empty_data_file_writes_no_tokenizer(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("\n")
    w = tmp_path / "w"
    cfg = micro_yaml(tmp_path / "m.yaml", ["data.dataset=gsm8k_aug", "data.path=" + str(data)])
    out = run_cli(["--stage", "textsft", "--config", str(cfg), "--workdir", str(w)])
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{data / 'train.txt'}: no examples" in out.stderr
    assert not w.exists() or sorted(p.name for p in Path(w).iterdir()) == []
