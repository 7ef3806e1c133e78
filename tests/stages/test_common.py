"""stages/common.py: the checks a stage makes of an `init_from` checkpoint before the workdir is touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.stages.common import check_init_from
from dlr_jax.train import main as train_main
from tests.hf_fixtures import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _cfg(init_from: Path | str, *extra: str):
    return load_config(ROOT / "configs" / "tiny.yaml", [f"init_from={init_from}", *extra])


def test_init_from_files_are_checked_before_a_stage_starts(tmp_path):
    ckpt = tmp_path / "llama"
    save_tiny_checkpoint("llama", ckpt)
    w = tmp_path / "w"
    check_init_from(_cfg(ckpt), "textsft", w)  # a complete checkpoint passes
    with pytest.raises(ConfigError, match="init_from=.*/nowhere: no such folder"):
        check_init_from(_cfg(tmp_path / "nowhere"), "align", w)
    # stages that do not load the weights are not checked: the checkpoint may have moved since textsft and align
    for stage, mode, extra in (("codebook", "both", ()), ("sft", "both", ()), ("textsft", "direct_from_cot", ()),
                               ("rl", "both", ("rl.evaluator=textsft_cot",)),
                               ("rl", "both", ("rl.process_weight=0",))):
        check_init_from(_cfg(tmp_path / "nowhere", *extra), stage, w, mode)
    with pytest.raises(ConfigError, match="no such folder"):  # the process reward's evaluator is the checkpoint
        check_init_from(_cfg(tmp_path / "nowhere", "rl.evaluator=backbone", "rl.process_weight=0.25"), "rl", w)
    bare = tmp_path / "bare"
    shutil.copytree(ckpt, bare)
    for f in bare.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ConfigError, match="no \\*.safetensors weights"):
        check_init_from(_cfg(bare), "align", w)
    shutil.copytree(ckpt, tmp_path / "notok")
    (tmp_path / "notok" / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="init_from=.*notok: no tokenizer.json"):
        check_init_from(_cfg(tmp_path / "notok"), "textsft", w)
    check_init_from(_cfg(tmp_path / "notok", f"tokenizer.path={ckpt}"), "textsft", w)  # another tokenizer folder
    (w / "tokenizer").mkdir(parents=True)  # a tokenizer folder a crash left without its file is not a tokenizer
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        check_init_from(_cfg(tmp_path / "notok"), "textsft", w)
    shutil.copy(ckpt / "tokenizer.json", w / "tokenizer" / "tokenizer.json")
    check_init_from(_cfg(tmp_path / "notok"), "textsft", w)  # the workdir's own tokenizer is made already
    (tmp_path / "noconf").mkdir()
    with pytest.raises(ConfigError, match="init_from: .*config.json"):
        check_init_from(_cfg(tmp_path / "noconf"), "all", w)


def test_cli_names_a_missing_checkpoint_in_one_line_and_writes_nothing(tmp_path, capsys):
    w = tmp_path / "w"
    code = train_main(["--stage", "textsft", "--config", str(ROOT / "configs" / "tiny.yaml"), "--workdir", str(w),
                       "--set", f"init_from={tmp_path / 'nowhere'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: init_from=") and "no such folder" in err
    assert not w.exists()


def test_an_rl_split_too_large_for_the_training_file_is_refused_before_the_workdir_exists(tmp_path, capsys):
    w = tmp_path / "w"
    code = train_main(["--stage", "textsft", "--config", str(ROOT / "configs" / "tiny.yaml"), "--workdir", str(w),
                       "--set", "data.rl_split=85620"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: data.rl_split=85620.0 leaves 85620 of ")
    assert not w.exists() or not any(w.iterdir())  # the lock's folder at most: no config.yaml, no tokenizer
