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
    # [Eval] greedy "dynamic" decoding: the model emits </latent> itself (no grammar forces the format), and the
    # answer is the <answer> span's; the paper's only sampling temperature is RL's (rl.temperature above)
    "eval.temperature": 0.0, "eval.decoding": "dynamic", "eval.answer_fallback": "off",
    # the real DeepEncoder V2: causal flow of Qwen2-0.5B shape, 896 wide (14 heads x 64)
    "codebook.flow_layers": 24, "codebook.flow_heads": 14, "codebook.flow_kv_heads": 2,
    "codebook.flow_head_dim": 64, "codebook.flow_mlp": 4864, "codebook.flow_hidden": 896,
    "codebook.vit_hidden": 768, "codebook.vit_layers": 12, "codebook.neck_channels": 256,
    "codebook.compressor_mid": 512,
}
for _stage in ("codebook.train", "train.textsft", "train.textsft_direct", "train.align", "train.sft", "train.rl"):
    PAPER.update({f"{_stage}.{k}": v for k, v in _EVERY_STAGE.items()})
# The losses as the paper writes them: sums ([Codebook] CE over the characters, VQ and commitment over the N
# latents' squared norms; [Align] / [SFT] CE over the tokens, the dual branch's too), per example. GRPO ([RL])
# aggregates its own way (rl.loss_agg_mode), so train.rl keeps the per-token mean.
for _stage in ("codebook.train", "train.textsft", "train.textsft_direct", "train.align", "train.sft"):
    PAPER[f"{_stage}.loss_reduction"] = "sum"
PAPER["train.rl.loss_reduction"] = "mean"
# The data protocol, from the paper's data section: "allocating all 385K for latent-text alignment, 300K for SFT,
# and the remaining 85K for RL" (the split stays 300K / 85K; align reads both parts).
PAPER_PROTOCOL: dict[str, object] = {"data.align_part": "all", "data.rl_split": 85620,
                                     # [Codebook] ~1M traces: GSM8K-Aug (385K) + MATH train (12K, MATH-500
                                     # excluded) + a stratified 603K sample of MathX-5M
                                     "codebook.corpus": ["gsm8k_aug:train", "math_train:train",
                                                         "mathx_5m:train@603000"]}
PAPER.update(PAPER_PROTOCOL)
# Settings the paper names without a value: the recipe sets one, and its comment must say the value is ours
# (never cite a section of the paper for it).
OURS = {"codebook.sigma": 0.1}  # "Gaussian noise N(0, sigma^2 I)" is added to h; sigma is not given


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


def test_math_recipe_overrides_data_eval_and_lengths_only():
    math = load_config(CONFIGS / "paper" / "math.yaml")
    gsm = load_config(CONFIGS / "paper" / "gsm8k.yaml")
    assert (math.data.dataset, math.data.rl_split, math.eval.benchmarks) == ("math_train", 4500, ("math500",))
    assert math.train == gsm.train and math.latent == gsm.latent
    lengths = {"max_prompt_tokens": math.rl.max_prompt_tokens, "process_max_cot_tokens": math.rl.process_max_cot_tokens}
    assert dataclasses.replace(gsm.rl, **lengths) == math.rl  # MATH's rl differs in its lengths only


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
    if name != "paper/math":  # MATH's budgets are sized from its lengths (test_math_lengths_keep_...)
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
    assert both.codebook == codebook.codebook
    assert both.latent == backbone.latent and both.latent.dual_branch == "on"  # D_ocr = the OCR-2 decoder


def test_the_ocr2_recipe_sizes_canvases_per_cot_and_its_rows_fit():
    """The paper's canvases (the smallest multiple of 64 that holds the CoT, in [64, 1024]) on the pretrained
    encoder: GSM8K-Aug CoTs become a few latent ids and their sft rows fit data.max_len. A 1024-px-only canvas
    (256 ids a CoT) next to max_len 256 is refused by the config check before any stage runs."""
    from dlr_jax.config import ConfigError
    from dlr_jax.data import render_pipeline as rp
    from dlr_jax.data.readers import load_benchmark
    from dlr_jax.run.preflight import FIXED_TOKENS, check_lengths

    cfg = load_config(CONFIGS / "qwen3-4b-ocr2.yaml", ["init_from=w/qwen3-4b", "codebook.init_from=w/deepseek-ocr2"])
    cb = cfg.codebook
    assert (cb.min_side, cb.max_side) == (64, 1024) and cfg.data.max_len == 256
    check_lengths(cfg)
    with pytest.raises(ConfigError, match="align and sft would drop every example"):
        check_lengths(dataclasses.replace(cfg, codebook=dataclasses.replace(cb, min_side=1024)))
    # every CoT of the GSM8K-Aug lines at hand, at the largest font the recipe draws: N = (side / 64)^2 <= 16
    rcfg = rp.render_config(cb)
    cots = [ex.cot for split in ("valid", "test") for ex in load_benchmark("gsm8k_aug", split=split)]
    n = [(rp.canvas_side(c, cb.font_max, rcfg)[0] // 64) ** 2 for c in cots[::4]]
    assert 1 <= min(n) and max(n) <= 16
    # which leaves an sft row (x ; <latent> z </latent> <answer> a </answer> <eos>) >= 230 tokens for x and a:
    # GSM8K questions are < 256 tokens in Qwen3's tokenizer (rl.max_prompt_tokens), most far below
    assert cfg.data.max_len - max(n) - FIXED_TOKENS >= 230
    # what a user checks before a run: per-CoT canvases and the dual branch on
    printed = _printed(CONFIGS / "qwen3-4b-ocr2.yaml", "codebook.init_from=w/deepseek-ocr2")
    assert printed["codebook"]["min_side"] < printed["codebook"]["max_side"]
    assert printed["latent"]["dual_branch"] == "on"


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


def _yaml_line(text: str, path: str) -> str:
    """The line of `text` (a config file) that sets `path` (a.b.c), found by indentation."""
    keys, depth, want = path.split("."), 0, None
    for line in text.splitlines():
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(stripped)
        if want is not None and indent < want:
            break
        if stripped.startswith(f"{keys[depth]}:"):
            if depth == len(keys) - 1:
                return line
            depth, want = depth + 1, indent + 1
    raise AssertionError(f"{path}: not set in the file")


def test_values_the_paper_does_not_give_are_marked_ours():
    text = (CONFIGS / "paper" / "gsm8k.yaml").read_text()
    cfg = load_config(CONFIGS / "paper" / "gsm8k.yaml")
    for path, value in OURS.items():
        section, key = path.rsplit(".", 1)
        obj = cfg
        for part in section.split("."):
            obj = getattr(obj, part)
        assert getattr(obj, key) == value, path
        comment = _yaml_line(text, path).partition("#")[2].strip()
        assert comment.startswith("ours"), f"{path}: the comment {comment!r} must say the value is ours"


def test_the_codebook_corpus_is_the_papers_million_traces_in_both_recipes():
    from dlr_jax.plan.totals import corpus_size

    gsm, math = (load_config(CONFIGS / "paper" / f"{n}.yaml") for n in ("gsm8k", "math"))
    assert math.codebook.corpus == gsm.codebook.corpus  # MATH's run does not train a MATH-only codebook
    assert corpus_size(gsm) == 385_620 + 12_000 + 603_000  # the planner's codebook epochs count all of it


def test_align_reads_the_whole_training_split_in_both_recipes():
    for name in ("gsm8k", "math"):
        data = load_config(CONFIGS / "paper" / f"{name}.yaml").data
        assert data.align_part == "all" and data.rl_split > 0, name  # the split stays; align reads both parts


# MATH's lengths are measured in characters and turned into tokens at this ratio: no real tokenizer is loaded in the
# suite (the recipe's tokenizer is the backbone checkpoint's). Counted once with the Qwen2/Qwen3 BPE's vocabulary
# (151,643 ranks, the byte-pair merges by rank): MATH train solutions average 2.42 characters a token, 89 % of CoT-SFT
# rows have more than 2.0, and at 2.0 each 99th percentile estimated below lies above the BPE's own (CoT-SFT rows
# 1,343 vs 1,170 tokens, MATH-500 solutions 910 vs 852, solutions for r_proc 1,136 vs 989, questions 501 vs 432).
CHARS_PER_TOKEN = 2.0


def test_math_lengths_keep_99_percent_of_targets_whole(data_dir):
    """configs/paper/math.yaml on MATH train (the stages' inputs) and MATH-500 (evaluation), read as the stages read
    them: every length budget keeps >= 99 % of its sequences whole (the recipe's GSM8K sizes kept 62 % of the
    codebook's targets)."""
    import math as m

    import numpy as np

    from dlr_jax.data.cot_view import cot_view
    from dlr_jax.data.formats import PROMPT_SEP
    from dlr_jax.data.sources import load_examples

    cfg = load_config(CONFIGS / "paper" / "math.yaml")
    train, held = load_examples(cfg, cfg.data.train_split), load_examples(cfg, cfg.data.eval_split)
    assert (len(train), len(held)) == (12_000, 500)

    def tok(text: str) -> int:
        return m.ceil(len(text) / CHARS_PER_TOKEN)

    def whole(lengths, budget: int) -> float:
        return float(np.mean(np.asarray(lengths) <= budget))

    n_max = (cfg.codebook.max_side // 64) ** 2  # the most latents a CoT gets: N = (side / 64)^2
    prompt = [1 + tok(ex.question.strip()) + tok(PROMPT_SEP) for ex in train]  # [<bos>] x
    answer = [3 + tok(ex.answer) for ex in train]  # <answer> a </answer> <eos>
    cot = [tok(ex.cot) for ex in train]
    chars = [len(cot_view(ex.cot, cfg.codebook.render_view, example_id=ex.id)) + 1 for ex in train]  # + EOS
    checks = {
        "codebook.max_text_len (characters)": whole(chars, cfg.codebook.max_text_len),
        "data.max_len, CoT-SFT rows": whole([p + c + a for p, c, a in zip(prompt, cot, answer, strict=True)],
                                            cfg.data.max_len),
        "data.max_len, align rows": whole([2 + n_max + c for c in cot], cfg.data.max_len),
        "data.max_len, sft rows": whole([p + 2 + n_max + a for p, a in zip(prompt, answer, strict=True)],
                                        cfg.data.max_len),
        "rl.max_prompt_tokens": whole(prompt, cfg.rl.max_prompt_tokens),
        "rl.process_max_cot_tokens": whole(cot, cfg.rl.process_max_cot_tokens),
        "eval.max_new_tokens, MATH-500 CoT": whole([tok(ex.cot) + 3 + tok(ex.answer) for ex in held],
                                                   cfg.eval.max_new_tokens),
    }
    short = {k: v for k, v in checks.items() if v < 0.99}
    assert not short, f"budgets keeping < 99 % of MATH sequences whole: {short}"
    gsm = load_config(CONFIGS / "paper" / "gsm8k.yaml")  # what the GSM8K sizes would have kept
    assert whole(chars, gsm.codebook.max_text_len) < 0.65 and whole(prompt, gsm.rl.max_prompt_tokens) < 0.99


def test_smollm2_is_the_recipe_on_one_gpu():
    """configs/smollm2-135m.yaml (the real model the suite runs, tests/stages/test_real_model.py): every paper value
    of the recipe; only the codebook stage takes its global batch of 64 in 8 micro-batches, to fit one device."""
    printed = _printed(CONFIGS / "smollm2-135m.yaml")
    wrong = {p: (_get(printed, p), v) for p, v in PAPER.items() if _get(printed, p) != v}
    assert not wrong, f"smollm2-135m: (printed, paper) differ: {wrong}"
    cfg = load_config(CONFIGS / "smollm2-135m.yaml")
    recipe = load_config(CONFIGS / "paper" / "gsm8k.yaml")
    for section in ("train", "rl", "latent", "data", "eval"):
        assert getattr(cfg, section) == getattr(recipe, section), section
    one_gpu = dataclasses.replace(recipe.codebook.train, grad_accum=8)
    assert cfg.codebook == dataclasses.replace(recipe.codebook, train=one_gpu)
    assert (cfg.model.model_type, cfg.model.num_layers, cfg.model.hidden_size, cfg.model.vocab_size) == (
        "llama", 30, 576, 49152)
    assert (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) == (1, -1, 1)
