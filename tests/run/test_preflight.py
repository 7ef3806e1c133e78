"""Counts and intervals that must be positive: refused before anything is written or compiled."""

from __future__ import annotations

import dataclasses
import re
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


def test_latents_that_fill_the_row_are_refused_before_any_stage_writes(tmp_path):
    """min_side = max_side = 1024 makes every CoT 256 latent ids: with the paper's max_len 256 align and sft would
    drop every example. Per-CoT canvases (min_side 64) pass; so do ids that are not the codebook's."""
    from dlr_jax.run.preflight import check_lengths
    from dlr_jax.stages import common

    fixed = ["codebook.min_side=1024", "codebook.max_side=1024", "data.max_len=256"]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*fixed, "latent.source=codebook"])
    with pytest.raises(ConfigError, match="at least 256 latent ids.*align and sft would drop every example"):
        check_lengths(cfg)
    with pytest.raises(ConfigError, match="codebook.min_side=64"):
        common.prepare_workdir(cfg, tmp_path / "w")
    assert not (tmp_path / "w").exists()
    check_lengths(load_config(ROOT / "configs" / "tiny.yaml", [*fixed[1:], "codebook.min_side=64",
                                                               "latent.source=codebook"]))
    check_lengths(load_config(ROOT / "configs" / "tiny.yaml", [*fixed, "latent.source=random"]))
    # the CLI refuses it too, before the workdir exists (a codebook stage would otherwise train for nothing)
    from dlr_jax import train

    argv = ["--stage", "codebook", "--config", str(ROOT / "configs" / "tiny.yaml"), "--workdir", str(tmp_path / "wd")]
    assert train.main([*argv, *sum((["--set", s] for s in [*fixed, "latent.source=codebook"]), [])]) == 2
    assert not (tmp_path / "wd").exists()


@pytest.mark.parametrize("override, named", [
    ("train.sft.learning_rate=-1", "train.sft.learning_rate=-1.0 (must be finite and >= 0)"),  # w/o SFT: 0
    ("train.rl.learning_rate=nan", "train.rl.learning_rate=nan (must be finite and > 0)"),
    ("train.textsft.learning_rate=0", "train.textsft.learning_rate=0.0 (must be finite and > 0)"),
    ("codebook.train.learning_rate=inf", "codebook.train.learning_rate=inf (must be finite and > 0)"),
    ("train.align.learning_rate=-0.1", "train.align.learning_rate=-0.1 (must be finite and >= 0)"),
    ("rl.beta=-0.001", "rl.beta=-0.001 (must be finite and >= 0)"),
    ("codebook.lambda_vq=nan", "codebook.lambda_vq=nan (must be finite and >= 0)"),
    ("latent.dual_branch_weight=inf", "latent.dual_branch_weight=inf (must be finite and >= 0)"),
])
def test_learning_rates_and_loss_weights_out_of_range_are_named(override, named):
    from dlr_jax.run.preflight import check_rates

    with pytest.raises(ConfigError, match=re.escape(named)):
        check_rates(load_config(TINY, [override]))


def test_a_zero_learning_rate_is_allowed_where_a_recipe_freezes_the_stage_by_design():
    from dlr_jax.run.preflight import check_rates

    check_rates(load_config(TINY))
    # the w/o-align and w/o-SFT ablations (experiments/plan.py) and the direct_from_cot control
    # (experiments/baselines.py); a weight of 0 turns a term off
    check_rates(load_config(TINY, ["train.align.learning_rate=0.0", "train.sft.learning_rate=0.0",
                                   "train.textsft_direct.learning_rate=0.0",
                                   "rl.process_weight=0", "rl.beta=0", "codebook.lambda_vq=0"]))


def test_cli_refuses_a_negative_learning_rate_and_writes_nothing(tmp_path, capsys):
    """It trained to exit 0 and wrote final/ as a finished stage."""
    from dlr_jax import train

    w = tmp_path / "w"
    code = train.main(["--stage", "textsft", "--config", str(micro_yaml(tmp_path / "m.yaml")), "--workdir", str(w),
                       "--set", "train.textsft.learning_rate=-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "train.textsft.learning_rate=-1.0 (must be finite and > 0)" in err[0]
    assert not w.exists()


def test_the_trainer_refuses_a_negative_or_nan_learning_rate_before_compiling(tmp_path):
    for lr in (-1.0, float("nan")):
        tr = Trainer(new_model(), lm_loss, dataclasses.replace(TCFG, learning_rate=lr), tmp_path / str(lr))
        with pytest.raises(ValueError, match="learning_rate=.* must be finite and >= 0"):
            tr.fit(iter(dataset()))
        assert tr._step_fn is None
