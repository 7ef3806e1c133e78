"""stages/common.py: the checks a stage makes of an `init_from` checkpoint before the workdir is touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.stages.common import backbone_architecture, check_init_from, new_backbone, pretrained_tokenizer
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
    with pytest.raises(ConfigError, match="init_from=.*/config.json: a file; init_from takes the folder holding it"):
        check_init_from(_cfg(ckpt / "config.json"), "align", w)
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


def test_the_papers_rl_count_on_the_subset_read_for_a_missing_full_file_becomes_its_fraction(data_dir, tmp_path,
                                                                                              capsys):
    """GSM8K-Aug's full train set missing, its 3,000-line subset read instead (readers.STAND_INS): the recipe's
    count of 85,620 RL examples (of 385,620) holds out the same fraction of the subset, says so in one line and in
    data_protocol.json. The full file keeps the count exactly; a count too large for a file read as itself (not a
    stand-in) is still refused."""
    import json
    import types
    import warnings

    from dlr_jax.data.protocol import PROTOCOL_FILE
    from dlr_jax.data.sources import load_examples
    from dlr_jax.stages.common import prepare_workdir, stage_examples

    lines = (data_dir / "gsm8k_aug" / "train_subset_3000.txt").read_text().splitlines()[:40]
    sub, full = tmp_path / "sub", tmp_path / "full"
    sub.mkdir(), full.mkdir()
    (sub / "train_subset_3000.txt").write_text("\n".join(lines) + "\n")  # train.txt missing: the stand-in is read
    (full / "train.txt").write_text("\n".join(lines) + "\n")
    tok = types.SimpleNamespace(encode_plain=str.split)
    paper = ["data.dataset=gsm8k_aug", "data.train_split=train", "data.rl_split=85620"]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*paper, f"data.path={sub}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reader's own warning that it read the subset
        train = load_examples(cfg, "train")
        prepare_workdir(cfg, tmp_path / "w", train)  # what refused the paper's recipe on the subset before
        stage_examples(cfg, tmp_path / "w", "sft", tok, train)
        rl = stage_examples(cfg, tmp_path / "w", "rl", tok, train)
    k = round(85620 / 385620 * 40)  # 9
    assert len(rl) == k and all(ex.id.startswith("gsm8k_aug/train_subset_3000/") for ex in rl)
    said = [line for line in capsys.readouterr().err.splitlines() if "rl_split" in line]
    assert said == [f"warning: data.rl_split=85,620 is a count of gsm8k_aug:train's 385,620 examples, but "
                    f"gsm8k_aug:train_subset_3000 was read in its place: RL holds out the same fraction (22.20%), "
                    f"{k} of 40 examples (recorded in data_protocol.json as rl_split_scaled)"]  # once, two stages
    rec = json.loads((tmp_path / "w" / PROTOCOL_FILE).read_text())
    assert (rec["rl_split"], rec["rl_examples"], rec["sft_examples"]) == (85620, k, 40 - k)
    assert rec["rl_split_scaled"] == {"configured": 85620, "of_full": 385620, "read": "gsm8k_aug:train_subset_3000",
                                      "fraction": 85620 / 385620}
    # the full file (here as short as the subset): the count is the recipe's, exactly, and nothing is scaled
    as_count = load_config(ROOT / "configs" / "tiny.yaml", [*paper[:2], "data.rl_split=12", f"data.path={full}"])
    assert len(stage_examples(as_count, tmp_path / "f", "rl", tok)) == 12
    assert "rl_split_scaled" not in json.loads((tmp_path / "f" / PROTOCOL_FILE).read_text())
    too_many = load_config(ROOT / "configs" / "tiny.yaml", [*paper, f"data.path={full}"])
    with pytest.raises(ConfigError, match="leaves 85620 of 40 training examples for RL"):
        stage_examples(too_many, tmp_path / "g", "rl", tok)


def test_a_truncated_checkpoint_file_is_one_line_naming_it(tmp_path, capsys):
    """The file checks before a stage cannot read every tensor: a checkpoint cut short (an interrupted copy)
    is found when the stage loads it, and said in one line (exit 2), not a traceback."""
    ckpt = tmp_path / "llama"
    save_tiny_checkpoint("llama", ckpt)
    [weights] = ckpt.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code = train_main(["--stage", "textsft", "--config", str(ROOT / "configs" / "tiny.yaml"), "--workdir",
                       str(tmp_path / "w"), "--set", f"init_from={ckpt}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and str(weights) in err[-1], err
    assert "readable safetensors" in err[-1] or "cannot be read" in err[-1], err


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_checkpoint_keeps_the_yamls_compute_and_parameter_dtypes(tmp_path, family):
    """The paper configs compute in bf16 and keep fp32 weights. `load_hf`'s own `dtype=` names the parameters,
    and the stage once passed the YAML's compute dtype there: the weights were stored in bf16 (AdamW's small
    updates then round away) and the model computed in fp32, the reverse of the YAML and of the planner's
    `backbone_architecture`."""
    import jax
    from flax import nnx

    from dlr_jax.core.sharding import make_mesh

    ckpt = tmp_path / family
    save_tiny_checkpoint(family, ckpt, fill_vocab=True)
    cfg = _cfg(ckpt, "model.dtype=bfloat16", "model.param_dtype=float32")
    tok = pretrained_tokenizer(cfg)
    model = new_backbone(cfg, tok, make_mesh(devices=jax.devices()[:1]))
    assert (model.cfg.dtype, model.cfg.param_dtype) == ("bfloat16", "float32")
    assert {str(x.dtype) for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {"float32"}
    arch = backbone_architecture(cfg)
    assert (arch.dtype, arch.param_dtype) == (model.cfg.dtype, model.cfg.param_dtype)



def test_align_reads_the_whole_split_when_told_and_the_protocol_records_it(tmp_path, monkeypatch):
    """data.align_part=all (the paper: "all 385K for latent-text alignment, 300K for SFT, and the remaining 85K
    for RL"): align reads the SFT and the RL parts, the split itself is unchanged, and data_protocol.json says so."""
    import json
    import types

    from dlr_jax.data.protocol import PROTOCOL_FILE
    from dlr_jax.stages import align, common
    from dlr_jax.stages.common import stage_examples

    tok = types.SimpleNamespace(encode_plain=str.split)
    base = ["data.synthetic_train=40", "data.rl_split=8"]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", base)
    ids = {p: {ex.id for ex in stage_examples(cfg, tmp_path / "a", p, tok)} for p in ("sft", "rl", "all")}
    assert (len(ids["sft"]), len(ids["rl"])) == (32, 8) and ids["all"] == ids["sft"] | ids["rl"]
    recorded = json.loads((tmp_path / "a" / PROTOCOL_FILE).read_text())
    assert "align_part" not in recorded  # the default keeps the record workdirs made before the key existed
    cfg_all = load_config(ROOT / "configs" / "tiny.yaml", [*base, "data.align_part=all"])
    assert {ex.id for ex in stage_examples(cfg_all, tmp_path / "b", "sft", tok)} == ids["sft"]  # the same split
    assert json.loads((tmp_path / "b" / PROTOCOL_FILE).read_text()) == {**recorded, "align_part": "all"}
    with pytest.raises(ValueError, match=r"differs from the recorded one in \['align_part'\]"):
        stage_examples(cfg_all, tmp_path / "a", "sft", tok)  # one workdir, one protocol
    with pytest.raises(ConfigError, match="data.align_part must be sft|all"):
        load_config(ROOT / "configs" / "tiny.yaml", ["data.align_part=rl"])

    # which part each latent stage asks for (stopped there: nothing is trained)
    asked = []

    def _stop(cfg, workdir, part, tok, train=None):
        asked.append(part)
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "stage_examples", _stop)
    for c in (cfg, cfg_all):
        with pytest.raises(KeyboardInterrupt):
            align.run(c, tmp_path / f"run{len(asked)}")
    assert asked == ["sft", "all"]
