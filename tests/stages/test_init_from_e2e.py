"""The paper's recipe end to end from a Hugging Face checkpoint, for every supported family.

Tiny random `transformers` checkpoints saved with a tokenizer, as a user downloads them: llama with
llama3 RoPE scaling and a tokenizer that fills every embedding row (so `<pad>` and the boundary tokens
need the embedding to grow: before the one backbone builder this NaN'd at textsft step 1), qwen3 and
the qwen3-vl text tower (tokenizers smaller than their embeddings, as Qwen's are). Each runs
textsft -> codebook -> export -> align -> sft (dual branch) -> rl (process reward) -> evaluate with
`init_from`, on configs/paper/gsm8k.yaml with only sizes and step counts shrunk, on 8 fake devices.

Cost: the codebook stage's encoder and OCR decoder do not depend on the backbone, so llama runs it and
the qwen workdirs receive its codebook/ and latents/ (copied files, the same ones a rerun would write).
The qwen3 checkpoint takes the qwen3-vl text tower's sizes and RoPE theta, so its programs are the same
and the second family reads them from the module's compile cache (the import paths and tokenizers still
differ: that is what the family is there for). Direct-SFT (the same code path as CoT-SFT with another
layout) runs for llama only.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.run.handoff import load_stage_model
from dlr_jax.stages import align, common, export, sft, textsft
from dlr_jax.stages.codebook import stage as codebook
from dlr_jax.stages.rl import stage as rl
from tests.hf_fixtures import save_tiny_checkpoint
from tests.micro import codebook_nets

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "paper" / "gsm8k.yaml"
STAGES = ("textsft", "textsft_direct", "align", "sft", "rl")
SHRINK = [
    # data: synthetic arithmetic, 40 training problems: 32 SFT / 8 RL
    "data.dataset=synthetic", "data.synthetic_train=40", "data.synthetic_eval=8", "data.rl_split=8",
    "model.dtype=float32", "codebook.dtype=float32", "codebook.remat=none",
    "latent.num_latents=32", "latent.latent_dim=16", "codebook.flow_hidden=0",
    # codebook: micro networks, one 128-px canvas (N = 4), the recipe's epochs over the 40 CoTs
    *codebook_nets(num_queries=4), "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128",
    "codebook.max_text_len=48", "codebook.corpus=[]", "codebook.eval_corpus=[]", "codebook.eval_examples=8",
    "codebook.eval_batch_size=8", "codebook.kmeans_init_batches=2", "codebook.kmeans_iters=2",
    "codebook.train.batch_size=16", "codebook.train.num_epochs=1",
    # rl: G = 4 rollouts of 24 tokens, one epoch over the 8 RL prompts
    "rl.group_size=4", "rl.max_new_tokens=24", "rl.max_latents=4", "rl.process_max_new_tokens=8",
    "rl.process_max_cot_tokens=48", "train.rl.batch_size=8",
    "eval.benchmarks=[synthetic]", "eval.max_new_tokens=24", "eval.max_latents=4", "eval.batch_size=8",
    "sampling.prompt_bucket=32",
]
for _s in (*STAGES, "codebook"):
    _t = "codebook.train" if _s == "codebook" else f"train.{_s}"
    SHRINK += [f"{_t}.progress=false", f"{_t}.async_checkpointing=false", f"{_t}.log_every=1"]
for _s in ("textsft", "textsft_direct", "align", "sft"):
    SHRINK += [f"train.{_s}.batch_size=16"]  # 3 epochs of 32 examples = 6 steps


# qwen3 with the qwen3-vl tower's head_dim and theta (tests/hf_fixtures.build_tiny_hf): one set of programs
SAME_AS_VL = {"qwen3": {"head_dim": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6}}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, compile_cache):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for family in ("llama", "qwen3", "qwen3_vl"):
        save_tiny_checkpoint(family, root / family, vocab_size=320, fill_vocab=family == "llama",
                             **SAME_AS_VL.get(family, {}))
        out[family] = root / family
    return out


def _finite_losses(workdir: Path, stage_dir: str) -> list[float]:
    rows = [json.loads(line) for line in (workdir / stage_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses, f"{stage_dir}: no loss logged"
    assert all(math.isfinite(x) for x in losses), f"{stage_dir}: non-finite loss {losses}"
    return losses


@pytest.fixture(scope="module")
def shared_codebook(tmp_path_factory, checkpoints):
    """codebook + export once (llama's workdir); the other families copy its outputs."""
    w = tmp_path_factory.mktemp("wd_llama")
    cfg = load_config(RECIPE, [*SHRINK, f"init_from={checkpoints['llama']}"])
    report = codebook.run(cfg, w)
    assert math.isfinite(report["held_out"]["cer_true"]) and report["K"] == 32
    _finite_losses(w, "codebook")
    export.run(cfg, w)
    return w


@pytest.mark.parametrize("family", ["llama", "qwen3_vl", "qwen3"])
def test_paper_recipe_runs_every_stage_from_a_checkpoint(family, checkpoints, shared_codebook, tmp_path_factory):
    assert len(jax.devices()) == 8
    cfg = load_config(RECIPE, [*SHRINK, f"init_from={checkpoints[family]}"])
    if family == "llama":
        w = shared_codebook
    else:
        w = tmp_path_factory.mktemp(f"wd_{family}")
        for sub in ("codebook", "latents"):
            shutil.copytree(shared_codebook / sub, w / sub)
    textsft.run(cfg, w, "cot")
    if family == "llama":  # Direct-SFT: the same stage with the [x ; <answer> a </answer>] layout
        textsft.run(cfg, w, "direct")
    align.run(cfg, w)
    sft.run(cfg, w)
    rl_result = rl.run(cfg, w)
    from dlr_jax.eval.evaluate import evaluate

    results = evaluate(w, "rl", progress=False)

    tok = common.get_tokenizer(cfg, w)
    hf_rows = json.loads((checkpoints[family] / "config.json").read_text())
    hf_rows = hf_rows.get("text_config", hf_rows).get("vocab_size", hf_rows.get("vocab_size"))
    if family == "llama":  # the tokenizer filled every row: the pad + 4 boundary tokens needed new ones
        assert tok.text_vocab_size > hf_rows and tok.text_vocab_size % cfg.tokenizer.pad_multiple == 0
    protocol = json.loads((w / "data_protocol.json").read_text())
    assert (protocol["sft_examples"], protocol["rl_examples"]) == (32, 8)
    assert protocol["align_part"] == "all"  # align: 3 epochs of all 40 at 16 = 8 steps (the paper's reading)
    for stage, steps in (("textsft_cot", 6), ("align", 8), ("sft", 6), ("rl", 4)):
        schedule = json.loads((w / stage / "schedule.json").read_text())
        assert schedule["num_steps"] == steps, (stage, schedule)
        _finite_losses(w, stage)
    assert rl_result.step == 4
    # r_proc ran: the codebook stage's character decoder read the rollouts' latents back and the evaluator answered
    rl_rows = [json.loads(line) for line in (w / "rl" / "metrics.jsonl").read_text().splitlines()]
    r_proc = [r["reward/process"] for r in rl_rows if "reward/process" in r]
    assert len(r_proc) == 4 and all(0.0 <= x <= 1.0 for x in r_proc), rl_rows
    # evaluate() nests the metrics under "benchmarks": every configured benchmark has a Pass@1 in [0, 1]
    assert set(results["benchmarks"]) == set(cfg.eval.benchmarks)
    for bench in results["benchmarks"].values():
        assert 0.0 <= bench["pass_at_1"]["mean"] <= 1.0 and bench["n"] > 0
    # the final model exports with --to-hf and transformers reads it with our logits (every predictable row:
    # text rows the tokenizer produces and the latent rows E_lat = P_in(C), W_lat = P_out(C))
    import torch
    import transformers

    from dlr_jax.convert import cli as convert_cli

    model, tok, _ = load_stage_model(w, "rl")
    out = tmp_path_factory.mktemp(f"hf_out_{family}")
    convert_cli.main(["--to-hf", "--from-workdir", str(w), "--stage", "rl", "--out", str(out), "--force"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    ids = np.asarray([[tok.eos_id, tok.latent_start_id, tok.latent_id(1), tok.latent_id(7), tok.latent_end_id,
                       tok.answer_start_id, *tok.encode_plain("12"), tok.answer_end_id]])
    ours = np.asarray(model(ids))
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids)).logits.float().numpy()
    keep = model.vocab_mask()
    assert np.isfinite(ours).all() and ours.shape[-1] == tok.total_vocab_size
    np.testing.assert_allclose(theirs[..., keep], ours[..., keep], atol=1e-4, rtol=1e-4)
