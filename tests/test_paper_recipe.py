"""The paper's per-stage settings reach every real-backbone config (`--print-config`)."""

from __future__ import annotations

import dataclasses
import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from dlr_jax import train
from dlr_jax.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
BACKBONES = ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "qwen3-4b", "qwen3vl-2b", "qwen3vl-4b", "qwen3vl-8b")

# Written from the paper (appendix table "Detailed per-stage training configurations" and the method
# section), not from configs/paper/gsm8k.yaml: dot path -> value.
_EVERY_STAGE = {"b1": 0.9, "b2": 0.999, "weight_decay": 0.01, "warmup_ratio": 0.03, "batch_size": 64,
                "optimizer": "adamw"}
PAPER: dict[str, object] = {
    "latent.num_latents": 10000, "latent.latent_dim": 896,
    "codebook.lambda_vq": 0.25, "codebook.beta": 0.1, "codebook.alpha_steps": -1,  # alpha over epoch 1
    "codebook.train.learning_rate": 1e-4, "codebook.train.num_epochs": 3,
    "train.align.learning_rate": 1e-4, "train.align.num_epochs": 3,
    "train.sft.learning_rate": 2e-5, "train.sft.num_epochs": 3, "latent.dual_branch": "on",
    "train.rl.learning_rate": 1e-6, "train.rl.num_epochs": 1,
    "rl.group_size": 32, "rl.temperature": 1.0, "rl.inner_epochs": 4, "rl.beta": 1e-3,
    "rl.process_weight": 0.25, "rl.format_weight": 0.1, "rl.answer_weight": 1.0,
    "rl.max_new_tokens": 256, "eval.max_new_tokens": 256,
    "data.max_len": 256, "data.max_cot_tokens": 2048, "data.dataset": "gsm8k_aug",
    "model.dtype": "bfloat16",
    "eval.seeds": 5, "eval.benchmarks": ["gsm8k", "gsm_hard", "svamp", "multiarith"],
    # the real DeepEncoder V2: causal flow of Qwen2-0.5B shape, 896 wide (14 heads x 64)
    "codebook.flow_layers": 24, "codebook.flow_heads": 14, "codebook.flow_kv_heads": 2,
    "codebook.flow_head_dim": 64, "codebook.flow_mlp": 4864, "codebook.flow_hidden": 896,
    "codebook.vit_hidden": 768, "codebook.vit_layers": 12, "codebook.neck_channels": 256,
    "codebook.compressor_mid": 512,
}
for _stage in ("codebook.train", "train.textsft", "train.textsft_direct", "train.align", "train.sft", "train.rl"):
    PAPER.update({f"{_stage}.{k}": v for k, v in _EVERY_STAGE.items()})


def _get(tree: dict, path: str):
    for key in path.split("."):
        tree = tree[key]
    return tree


def _printed(config: Path, *overrides: str) -> dict:
    buf = io.StringIO()
    args = ["--print-config", "--config", str(config)]
    for o in overrides:
        args += ["--set", o]
    with redirect_stdout(buf):
        assert train.main(args) == 0
    return yaml.safe_load(buf.getvalue())


@pytest.mark.parametrize("name", ["llama3.1-8b", "qwen3-4b"])
def test_print_config_shows_every_paper_value(name):
    printed = _printed(CONFIGS / f"{name}.yaml")
    wrong = {p: (_get(printed, p), v) for p, v in PAPER.items() if _get(printed, p) != v}
    assert not wrong, f"{name}: (printed, paper) differ: {wrong}"
    # the SFT/RL split: GSM8K-Aug's 385,620 examples -> 300k SFT / 85k RL
    assert 385_620 - printed["data"]["rl_split"] == 300_000
    # latent caps long enough for MATH (#L ~ 28-29 in the paper) with room for the answer span
    for section in ("rl", "eval"):
        assert 29 < printed[section]["max_latents"] <= printed[section]["max_new_tokens"] - 5


@pytest.mark.parametrize("name", BACKBONES)
def test_every_backbone_file_is_the_recipe_plus_an_architecture(name):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    recipe = load_config(CONFIGS / "paper" / "gsm8k.yaml")
    for section in ("train", "rl", "codebook", "latent", "data", "eval"):
        assert getattr(cfg, section) == getattr(recipe, section), section
    assert cfg.model.vocab_size > 100_000 and cfg.model.num_layers >= 16
    assert cfg.model.num_heads * cfg.model.head_dim >= cfg.model.hidden_size // 2


def test_math_recipe_overrides_data_and_eval_only():
    math = load_config(CONFIGS / "paper" / "math.yaml")
    gsm = load_config(CONFIGS / "paper" / "gsm8k.yaml")
    assert (math.data.dataset, math.data.rl_split, math.eval.benchmarks) == ("math_train", 4500, ("math500",))
    assert math.train == gsm.train and math.rl == gsm.rl and math.latent == gsm.latent


def test_print_config_applies_overrides_and_needs_no_workdir():
    printed = _printed(CONFIGS / "qwen3-4b.yaml", "train.sft.learning_rate=3e-5", "train.sft.profile_steps=10:15")
    assert printed["train"]["sft"]["learning_rate"] == 3e-5
    assert printed["train"]["sft"]["profile_steps"] == "10:15"  # a string field keeps the text (not 615)


def test_print_config_without_a_config_or_a_workdir_is_refused(capsys):
    """It would print the built-in defaults, which no run uses (a run without --config refuses too)."""
    with pytest.raises(SystemExit) as e:
        train.main(["--print-config"])
    assert e.value.code == 2 and "--print-config needs --config" in capsys.readouterr().err


def test_stage_and_workdir_still_required_without_print_config(capsys):
    with pytest.raises(SystemExit):
        train.main(["--config", str(CONFIGS / "tiny.yaml")])
    assert "--stage and --workdir are required" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["paper/gsm8k", "paper/math", "qwen3-4b"])
def test_recipe_passes_the_stages_own_checks(name):
    from dlr_jax.stages.rl import stage as rl
    cfg = load_config(CONFIGS / f"{name}.yaml")
    rl._check(cfg)  # raises listing every inconsistent rl setting
    assert cfg.rl.max_prompt_tokens + cfg.rl.max_new_tokens >= 2 * cfg.data.max_len  # prompts have a budget


def test_the_ocr2_pipeline_is_the_backbone_run_with_the_ocr2_codebook():
    """configs/qwen3-4b-ocr2.yaml serves every stage of one workdir: the LM stages exactly as qwen3-4b.yaml, the
    codebook exactly as codebook-ocr2.yaml, so no stage after the codebook differs from what it recorded."""
    sets = ["init_from=weights/qwen3-4b", "codebook.init_from=weights/deepseek-ocr2"]
    both = load_config(CONFIGS / "qwen3-4b-ocr2.yaml", sets)
    backbone = load_config(CONFIGS / "qwen3-4b.yaml", sets)
    codebook = load_config(CONFIGS / "codebook-ocr2.yaml", sets)
    for section in ("model", "train", "rl", "data", "eval", "mesh"):
        assert getattr(both, section) == getattr(backbone, section), section
    assert both.codebook == codebook.codebook and both.codebook.min_side == both.codebook.max_side == 1024
    assert both.latent.dual_branch == "auto" and dataclasses.replace(both.latent, dual_branch="on") == backbone.latent


def test_print_config_with_init_from_names_the_checkpoint_s_architecture(tmp_path):
    # the model section printed is the YAML's; a run from init_from builds config.json's architecture, so the
    # printout says which values those are (as YAML comments: the output still loads)
    from tests.hf_fixtures import save_tiny_hf

    save_tiny_hf("qwen3", tmp_path / "ckpt")
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert train.main(["--print-config", "--config", str(CONFIGS / "qwen3-4b.yaml"),
                           "--set", f"init_from={tmp_path / 'ckpt'}"]) == 0
    text = buf.getvalue()
    assert yaml.safe_load(text)["model"]["hidden_size"] == 2560  # the YAML's, as given
    notes = [line for line in text.splitlines() if line.startswith("#")]
    assert "config.json's architecture" in notes[0] and "#   model.hidden_size: 64" in notes
    assert not any("model.remat" in n or "model.dtype" in n for n in notes)  # run keys stay the YAML's
