"""The paper's own path end to end from a pretrained DeepSeek-OCR-2 codebook, on configs/qwen3-4b-ocr2.yaml with
only sizes and step counts shrunk: codebook (fine-tuning a tiny random deepseek_ocr2 checkpoint, per-CoT canvases)
-> export -> align -> sft (the dual branch: D_ocr = the OCR-2 decoder) -> rl (the process reward decodes the
rollouts' latents with that decoder and a real tiny evaluator LM answers) -> evaluate -> interpret, from a tiny
random Qwen3 checkpoint whose tokenizer fills every embedding row, on GSM8K-Aug lines of ../shared/data.

The lines are chosen so that every stage keeps every example: questions <= 110 characters and CoTs <= 90 (the
tiny tokenizers spend a token a byte), and CoTs that render to 128 or 192 px at every font the recipe draws
(N = 4 or 9 latent ids; two canvas sides, so two compiles a network)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.data import render_pipeline as rp
from dlr_jax.text import render
from tests.hf_fixtures import save_tiny_checkpoint, save_tiny_ocr2

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "qwen3-4b-ocr2.yaml"
SHARED = ROOT.parent / "shared" / "data" / "gsm8k_aug"
TRAIN, TEST = 40, 8
STAGES = ("align", "sft", "rl")
SHRINK = [
    "data.rl_split=8", "model.dtype=float32", "codebook.dtype=float32", "codebook.remat=none",
    "latent.num_latents=16", "latent.latent_dim=32",  # K, and d_c of the tiny checkpoint's causal flow
    # codebook: the CoTs of data.path, targets up to 96 of the checkpoint's (one-a-character) tokens, one epoch
    "codebook.corpus=[]", "codebook.eval_corpus=[]", "codebook.max_text_len=96", "codebook.eval_examples=8",
    "codebook.eval_batch_size=8", "codebook.kmeans_init_batches=2", "codebook.kmeans_iters=2",
    "codebook.train.batch_size=8", "codebook.train.num_epochs=1",
    # 32 SFT-side examples: align 2 steps, sft 3 epochs = 6 steps; rl: 2 prompts x G = 4 rollouts a step, 2 steps
    "train.align.batch_size=16", "train.align.num_epochs=1", "train.sft.batch_size=16",
    "rl.group_size=4", "rl.max_new_tokens=24", "rl.max_latents=12", "rl.process_max_new_tokens=8",
    "rl.process_max_cot_tokens=48", "train.rl.batch_size=8", "train.rl.num_epochs=0.5",
    "eval.benchmarks=[gsm8k_aug]", "eval.seeds=1", "eval.limit=8", "eval.batch_size=8", "eval.max_new_tokens=24",
    "eval.max_latents=12", "sampling.prompt_bucket=32",
]
for _s in STAGES:
    SHRINK += [f"train.{_s}.progress=false", f"train.{_s}.async_checkpointing=false", f"train.{_s}.log_every=1"]
SHRINK += ["codebook.train.progress=false", "codebook.train.async_checkpointing=false", "codebook.train.log_every=1"]


def pick_lines(split_file: Path, n: int) -> list[str]:
    """The first `n` lines that fit (see the module docstring), with every line that renders to 192 px at the
    export's font first, so both canvas sides are there."""
    rcfg = render.RenderConfig(min_side=64, max_side=1024)
    fit, big = [], []
    for line in split_file.read_text().splitlines():
        q, _, rest = line.partition("||")
        cot = rest.split("####")[0].strip()
        if len(q) > 110 or len(cot) > 90:
            continue
        if {rp.canvas_side(cot, f, rcfg)[0] for f in range(15, 21)} <= {128, 192}:
            (big if rp.canvas_side(cot, 18, rcfg)[0] == 192 else fit).append(line)
    return (big + fit)[:n]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ocr2_e2e")
    data = root / "data" / "gsm8k_aug"
    data.mkdir(parents=True)
    (data / "train.txt").write_text("\n".join(pick_lines(SHARED / "train_subset_3000.txt", TRAIN)) + "\n")
    (data / "test.txt").write_text("\n".join(pick_lines(SHARED / "test.txt", TEST)) + "\n")
    save_tiny_ocr2(root / "ocr2", seed=0, small=True)
    save_tiny_checkpoint("qwen3", root / "qwen3", vocab_size=320, fill_vocab=True)
    sets = [*SHRINK, f"init_from={root / 'qwen3'}", f"codebook.init_from={root / 'ocr2'}", f"data.path={data}"]
    return root, sets


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def one(inputs, tmp_path_factory):
    """The whole path as one process on 8 devices: (workdir, config, export info, evaluate's results, interpret's
    rows)."""
    from dlr_jax.eval import interpret
    from dlr_jax.eval.evaluate import evaluate
    from dlr_jax.stages import align, export, sft
    from dlr_jax.stages.codebook import stage as codebook
    from dlr_jax.stages.rl import stage as rl

    assert len(jax.devices()) == 8
    root, sets = inputs
    cfg = load_config(CONFIG, sets)
    w = tmp_path_factory.mktemp("one") / "w"
    report = codebook.run(cfg, w)
    assert report["K"] == 16 and math.isfinite(report["held_out"]["ce_true"])
    info = export.run(cfg, w)
    align.run(cfg, w)
    sft.run(cfg, w)
    assert rl.run(cfg, w).step == 2
    results = evaluate(w, "rl", data_dir=root / "data", progress=False)
    # constrained: a six-step tiny model does not open a latent span under the recipe's dynamic decoding, and what is
    # checked here is the OCR-2 decoder reading generated latents
    rows = interpret.build_rows(w, stage="rl", benchmark="gsm8k_aug", n=4, data_dir=root / "data",
                                decoding="constrained")
    return w, cfg, info, results, rows


def test_the_paper_path_from_a_pretrained_ocr2_codebook(one, tmp_path):
    from dlr_jax.data.items import filter_by_length
    from dlr_jax.data.latents import latents_path, read_latents
    from dlr_jax.data.sources import load_examples
    from dlr_jax.eval import interpret
    from dlr_jax.stages import common

    w, cfg, info, results, rows = one
    assert cfg.codebook.min_side < cfg.codebook.max_side and cfg.latent.dual_branch == "on"
    # per-CoT canvases: N = (side / 64)^2 ids, 4 or 9 here, on GSM8K-Aug lines; nothing overflowed the largest
    for split in ("train", "test"):
        n = {len(z) for z in read_latents(latents_path(w, split), num_codes=16).values()}
        assert n <= {4, 9} and 4 in n, (split, n)
        assert info[split]["overflow"] == {"max_side": 1024, "shrunk": 0, "truncated": 0}
    latents = read_latents(latents_path(w, "train"), num_codes=16)
    assert 9 in {len(z) for z in latents.values()}
    assert (w / "codebook" / "final" / "tokenizer.json").is_file()  # sft, rl and interpret read OCR-2 tokens

    # no example dropped for length: every example align and sft read fits their rows
    tok = common.get_tokenizer(cfg, w)
    train = load_examples(cfg, cfg.data.train_split)
    for stage, part in (("align", cfg.data.align_part), ("sft", "sft")):
        examples = common.stage_examples(cfg, w, part, tok, train)
        kept, dropped = filter_by_length(stage, examples, tok, max_len=cfg.data.max_len, latents=latents)
        assert dropped == 0 and len(kept) == len(examples) >= 32, stage
    # the dual branch trained D_ocr = the OCR-2 decoder, and its loss fell
    assert json.loads((w / "sft" / "dual_branch.json").read_text()) == {"on": True}
    assert json.loads((w / "sft" / "decoder" / "meta.json").read_text())["kind"] == "ocr2_decoder"
    ocr_ce = [r["ocr_ce"] for r in _rows(w / "sft" / "metrics.jsonl") if "ocr_ce" in r]
    assert len(ocr_ce) == 6 and all(math.isfinite(x) for x in ocr_ce)
    assert np.mean(ocr_ce[-2:]) < np.mean(ocr_ce[:2]), ocr_ce
    # rl ran the process reward: D_ocr read the rollouts' latents and the evaluator LM answered
    r_proc = [r["reward/process"] for r in _rows(w / "rl" / "metrics.jsonl") if "reward/process" in r]
    assert len(r_proc) == 2 and all(0.0 <= x <= 1.0 for x in r_proc)

    assert set(results["benchmarks"]) == {"gsm8k_aug"}
    bench = results["benchmarks"]["gsm8k_aug"]
    assert bench["n"] == TEST and 0.0 <= bench["pass_at_1"]["mean"] <= 1.0

    assert len(rows) == 4 and all(isinstance(r["decoded_cot"], str) for r in rows)
    assert any(r["latent_codes"] and r["decoded_cot"] for r in rows)  # the OCR-2 decoder read generated latents
    html, _ = interpret.write_report(rows, tmp_path / "report.html", title="ocr2")
    assert "OCR decoder reads them as" in html.read_text()


def _two_processes(workdir: Path, stages: str, data_dir: Path, timeout: int = 1500) -> list[str]:
    """tests/mp_driver.py as 2 processes of 4 CPU devices each; every rank must exit 0."""
    import os
    import socket
    import subprocess
    import sys

    from tests.xla_env import xla_flags

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ranks = []
    for i in range(2):
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(4), DLR_DATA_DIR=str(data_dir),
                   DLR_COORDINATOR=f"127.0.0.1:{port}", DLR_NUM_PROCESSES="2", DLR_PROCESS_ID=str(i))
        ranks.append(subprocess.Popen([sys.executable, "-m", "tests.mp_driver", str(workdir), stages], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [r.communicate(timeout=timeout)[0] for r in ranks]
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
    for i, (r, out) in enumerate(zip(ranks, outs, strict=True)):
        assert r.returncode == 0, f"rank {i} exited {r.returncode}:\n{out[-4000:]}"
    return outs


def test_two_processes_of_4_devices_give_the_results_of_one_of_8(one, inputs, tmp_path):
    from dlr_jax.eval import interpret
    from dlr_jax.stages import common

    w1, cfg, _, results, rows = one
    root, _ = inputs
    w2 = tmp_path / "w"
    common.prepare_workdir(cfg, w2)  # the run's config.yaml: the driver's stages read it
    _two_processes(w2, "codebook,export,align,sft,rl,evaluate:gsm8k_aug", root / "data")
    for stage in ("codebook", "align", "sft"):
        a, b = _rows(w1 / stage / "metrics.jsonl"), _rows(w2 / stage / "metrics.jsonl")
        assert [m["step"] for m in a] == [m["step"] for m in b] and a, stage
        for x, y in zip(a, b, strict=True):
            assert x["batch_hash"] == y["batch_hash"], stage  # the same global batches
            np.testing.assert_allclose(x["loss"], y["loss"], rtol=1e-5, err_msg=stage)
            if stage == "sft":
                np.testing.assert_allclose(x["ocr_ce"], y["ocr_ce"], rtol=1e-5)
    np.testing.assert_allclose(np.load(w1 / "codebook" / "codebook.npy"), np.load(w2 / "codebook" / "codebook.npy"),
                               atol=1e-5)
    for split in ("train", "test"):
        assert (w1 / "latents" / f"{split}.jsonl").read_text() == (w2 / "latents" / f"{split}.jsonl").read_text()
    a, b = _rows(w1 / "rl" / "metrics.jsonl"), _rows(w2 / "rl" / "metrics.jsonl")
    assert len(a) == len(b) == 2
    for x, y in zip(a, b, strict=True):
        for k in ("reward", "reward/answer", "reward/format", "reward/process", "n_latents"):
            assert x[k] == y[k], (k, x[k], y[k])  # the same rollouts, decoded and judged alike
    r2 = json.loads((w2 / "rl" / "eval" / "results.json").read_text())["benchmarks"]["gsm8k_aug"]
    r1 = results["benchmarks"]["gsm8k_aug"]
    for k in ("n", "pass_at_1", "n_latents"):
        assert r1[k] == r2[k], k
    again = interpret.build_rows(w2, stage="rl", benchmark="gsm8k_aug", n=4, data_dir=root / "data",
                                 decoding="constrained")
    assert [r["decoded_cot"] for r in again] == [r["decoded_cot"] for r in rows]
    assert [r["latent_codes"] for r in again] == [r["latent_codes"] for r in rows]
