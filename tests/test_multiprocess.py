"""Multi-process runs (2 processes x 4 CPU devices, gloo collectives) give the numbers of one process
with 8 devices: the same global batches (batch_hash), losses (also after every process restores a
checkpoint they all saved), codebook, exported latent ids, RL rewards and evaluation outputs.

Cost: the full chain textsft -> codebook -> export -> align -> sft -> rl -> evaluate as two processes takes
minutes on a 2-core machine, too slow for the suite; the test starts from a prepared workdir (tokenizer,
an untrained textsft_cot and align/final) and runs codebook (micro networks, a dead-code refresh, the
held-out report) -> export -> sft with the dual branch -> rl -> evaluate: the stages that put rngs,
scalars and masks on the mesh and fetch sharded results to the host, the sampler included. textsft and
align (the Trainer alone, as sft) were checked by hand the same way, also from a tiny HF Llama whose
tokenizer fills every embedding row (`init_from`: every stage ran, numbers equal to ~3e-7)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.data.sources import load_examples
from dlr_jax.run.handoff import save_stage_model
from dlr_jax.stages import common
from dlr_jax.stages.latent_common import new_latent_lm
from tests.micro import codebook_nets
from tests.xla_env import xla_flags

ROOT = Path(__file__).resolve().parents[1]
SETS = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=60", "data.synthetic_eval=20",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=32",
    "latent.latent_dim=16", "latent.source=codebook", "mesh.fsdp=-1", "sampling.prompt_bucket=16",
    "train.sft.batch_size=8", "train.sft.num_steps=2", "train.sft.learning_rate=1e-2", "train.sft.log_every=1",
    "train.sft.progress=false", "rl.num_prompts=2", "rl.group_size=4", "rl.max_new_tokens=16", "rl.max_latents=4",
    "rl.inner_epochs=1", "rl.prompt_pool=0", "rl.eval_prompts=0", "train.rl.batch_size=8", "train.rl.num_steps=1",
    "train.rl.learning_rate=1e-3", "train.rl.progress=false",
    # a reward that varies inside the groups of even-gold problems: all-zero advantages would make the update
    # rounding noise; dynamic sampling drops the other groups and refills from the prompt stream
    "rl.extra_rewards=[distinct_share_even_golds=1.0]", "rl.reward_modules=[tests.mp_rewards]",
    "rl.dynamic_sampling=true", "rl.dynamic_sampling_max_refills=3",
    "eval.limit=8", "eval.batch_size=8", "eval.max_new_tokens=16", "eval.max_latents=4",
    # the codebook stage at micro size: 2 steps with a dead-code refresh between them (it encodes probe batches as
    # the k-means init does, so that one is left out here), the held-out report
    *codebook_nets(num_queries=4), "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128",
    "codebook.max_text_len=48", "codebook.eval_examples=8", "codebook.eval_batch_size=16",
    "codebook.kmeans_init_batches=0", "codebook.warmup_steps=0", "codebook.alpha_steps=0",
    "codebook.dead_code_every=1", "codebook.train.batch_size=16", "codebook.train.num_steps=2",
    "codebook.train.progress=false", "codebook.train.log_every=1",
]
# sft@3: every process restores sft's step-2 checkpoint and trains step 3; sft trains the dual branch (auto: the
# codebook stage's decoder is there)
STAGES = "codebook,export,sft,sft@3,rl,evaluate"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(jax.device_count() < 8, reason="the 1-process reference needs 8 fake devices (XLA_FLAGS)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(workdir: Path, procs: int, stages: str = STAGES, sets: list[str] = SETS, timeout: int = 540,
           rank_sets: dict[int, list[str]] | None = None) -> tuple[list[int], list[str]]:
    """`procs` ranks of tests/mp_driver.py, 8 // procs CPU devices each (rank i adds `rank_sets[i]` to `sets`):
    their exit codes and outputs."""
    port, ranks = _free_port(), []
    for i in range(procs):
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(8 // procs))
        env |= {"DLR_COORDINATOR": f"127.0.0.1:{port}", "DLR_NUM_PROCESSES": str(procs), "DLR_PROCESS_ID": str(i)}
        argv = [str(workdir), stages, *sets, *(rank_sets or {}).get(i, [])]
        ranks.append(subprocess.Popen([sys.executable, "-m", "tests.mp_driver", *argv], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in ranks:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in ranks], outs


def _run(workdir: Path, procs: int) -> None:
    """The stages as `procs` processes; every one must exit 0."""
    codes, outs = _start(workdir, procs)
    for i, (code, out) in enumerate(zip(codes, outs, strict=True)):
        assert code == 0, f"rank {i} exited {code}:\n{out[-4000:]}"
    # metrics are printed once (rank 0), not once per process
    assert "[rl] step 1/1" in outs[0] and all("[rl] step" not in o for o in outs[1:])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """tokenizer, untrained textsft_cot/final and align/final: what stages sft and rl read."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml", SETS)
    w = tmp_path_factory.mktemp("mp") / "prepared"
    common.prepare_workdir(cfg, w)
    tok = common.get_tokenizer(cfg, w, load_examples(cfg, "train"))
    backbone = common.new_backbone(cfg, tok, common.make_mesh_for(cfg))
    save_stage_model(backbone, w, "textsft_cot", kind="backbone", model_cfg=backbone.cfg)
    lm = new_latent_lm(cfg, w, tok, common.make_mesh_for(cfg))
    save_stage_model(lm, w, "align", kind="latent_lm", model_cfg=lm.model_cfg)
    return w


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_processes_match_one_process(prepared, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(prepared, one)
    shutil.copytree(prepared, two)
    _run(one, 1)
    _run(two, 2)
    cb1, cb2 = _lines(one / "codebook" / "metrics.jsonl"), _lines(two / "codebook" / "metrics.jsonl")
    assert [m["step"] for m in cb1] == [m["step"] for m in cb2] == [1, 2]
    for a, b in zip(cb1, cb2, strict=True):
        assert a["batch_hash"] == b["batch_hash"]
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)
    np.testing.assert_allclose(np.load(one / "codebook" / "codebook.npy"), np.load(two / "codebook" / "codebook.npy"),
                               atol=1e-5)
    rep1, rep2 = (json.loads((w / "codebook" / "report.json").read_text()) for w in (one, two))
    assert rep1["dead_code_refreshes"] == rep2["dead_code_refreshes"] and rep1["dead_code_refreshes"][0][0] == 1
    assert rep1["held_out"]["cer_true"] == rep2["held_out"]["cer_true"]
    for split in ("train", "test"):  # every example's latent ids, the same from both runs
        assert (one / "latents" / f"{split}.jsonl").read_text() == (two / "latents" / f"{split}.jsonl").read_text()
    assert (one / "sft" / "decoder").is_dir() and (two / "sft" / "decoder").is_dir()  # the dual branch trained
    sft1, sft2 = _lines(one / "sft" / "metrics.jsonl"), _lines(two / "sft" / "metrics.jsonl")
    # steps 1-2, then a second run that restored the 2-process checkpoint (saved by every process) for step 3
    assert [m["step"] for m in sft1] == [m["step"] for m in sft2] == [1, 2, 3]
    for a, b in zip(sft1, sft2, strict=True):
        assert a["batch_hash"] == b["batch_hash"]  # the same global batch, step for step
        np.testing.assert_allclose([a["loss"], a["grad_norm"]], [b["loss"], b["grad_norm"]], rtol=1e-5)
    rl1, rl2 = _lines(one / "rl" / "metrics.jsonl"), _lines(two / "rl" / "metrics.jsonl")
    assert len(rl1) == len(rl2) == 1
    for a, b in zip(rl1, rl2, strict=True):
        for k in ("reward", "reward_std", "reward/answer", "reward/format", "reward/distinct_share_even_golds",
                  "accuracy", "n_latents", "completion_length", "dynamic/refills", "dynamic/rollouts",
                  "dynamic/groups_dropped", "dynamic/groups_topped_up"):
            assert a[k] == b[k], (k, a[k], b[k])  # the same rollouts, the same groups dropped and refilled
        assert a["reward_std"] > 0  # non-trivial advantages, so the next comparisons mean something
        np.testing.assert_allclose([a["entropy"], a["grad_norm"], a["kl"]], [b["entropy"], b["grad_norm"], b["kl"]],
                                   rtol=1e-4, atol=1e-7)
    assert rl1[0]["dynamic/groups_dropped"] > 0 and rl1[0]["dynamic/refills"] > 0  # the refill ran
    saved = [json.loads((w / "rl" / "checkpoints" / "1" / "data" / "metadata").read_text()) for w in (one, two)]
    assert saved[1] == {"per_process": [saved[0]] * 2}  # every process's prompt stream went as far as one process's
    r1 = json.loads((one / "rl" / "eval" / "results.json").read_text())["benchmarks"]["synthetic"]
    r2 = json.loads((two / "rl" / "eval" / "results.json").read_text())["benchmarks"]["synthetic"]
    assert r1["n"] == r2["n"] == 8
    for k in ("pass_at_1", "n_latents", "gen_tokens", "format_ok"):
        assert r1[k] == r2[k], k
    s1, s2 = _lines(one / "rl" / "eval" / "samples.jsonl"), _lines(two / "rl" / "eval" / "samples.jsonl")
    assert [s["prediction"] for s in s1] == [s["prediction"] for s in s2]
    assert (two / "rl" / "final" / "meta.json").is_file()


def test_a_run_process_0_refuses_stops_every_process(prepared, tmp_path):
    """Only process 0 checks the config; when it refuses (here a model change), the other process must
    exit with the reason, not wait at the first collective for a process that is gone."""
    w = tmp_path / "w"
    shutil.copytree(prepared, w)
    sets = [s for s in SETS if not s.startswith("model.num_layers=")] + ["model.num_layers=2"]
    codes, outs = _start(w, 2, stages="sft", sets=sets, timeout=240)
    assert codes == [2, 2], outs
    assert "refusing to change model.num_layers: 1 -> 2" in outs[0]
    assert "process 0 did not start this run" in outs[1]
    assert not (w / "sft").exists()


def test_a_host_without_the_checkpoint_stops_every_process(prepared, tmp_path):
    """Every process checks `init_from`'s files (a host may lack them) before anything is written; one that
    cannot read them must stop the others, not leave them waiting at the first collective until a timeout."""
    w = tmp_path / "w"
    shutil.copytree(prepared, w)
    before = sorted(p.relative_to(w) for p in w.rglob("*"))
    missing = tmp_path / "not_on_this_host"
    codes, outs = _start(w, 2, stages="textsft", timeout=240, rank_sets={1: [f"init_from={missing}"]})
    assert codes == [2, 2], outs
    assert f"error: process 1: init_from={missing}: no such folder" in outs[1]
    assert "error: process(es) 1 of this run refused it" in outs[0]
    assert sorted(p.relative_to(w) for p in w.rglob("*")) == before  # nothing written


def test_a_host_with_another_config_stops_every_process(prepared, tmp_path):
    """A refusal before jax.distributed.initialize (here a bad --set on one host only) is voted on too."""
    w = tmp_path / "w"
    shutil.copytree(prepared, w)
    codes, outs = _start(w, 2, stages="sft", timeout=240, rank_sets={0: ["train.sft.num_steps=0"]})
    assert codes == [2, 2], outs
    assert "error: process 0: " in outs[0] and "num_steps" in outs[0]
    assert "error: process(es) 0 of this run refused it" in outs[1]
    assert not (w / "sft").exists()


def test_a_broken_checkpoint_file_on_one_host_stops_every_process(prepared, tmp_path):
    """A failure of the `init_from` check that is not a config refusal (here a config.json that is not UTF-8: a
    broken copy, not a wrong setting) still reaches the vote, so the other process stops with the reason instead of
    waiting at the first collective; the broken host shows its traceback (exit 1), and nothing is written."""
    w = tmp_path / "w"
    shutil.copytree(prepared, w)
    before = sorted(p.relative_to(w) for p in w.rglob("*"))
    broken = tmp_path / "broken_copy"
    broken.mkdir()
    (broken / "config.json").write_bytes(b'{"model_type": "llama", \xff\xfe}')
    codes, outs = _start(w, 2, stages="textsft", timeout=240, rank_sets={1: [f"init_from={broken}"]})
    assert codes == [2, 1], outs
    assert "error: process 1: init_from: UnicodeDecodeError" in outs[1]
    assert "Traceback" in outs[1] and "UnicodeDecodeError" in outs[1].rsplit("Traceback", 1)[1]
    assert "error: process(es) 1 of this run refused it" in outs[0]
    assert sorted(p.relative_to(w) for p in w.rglob("*")) == before  # nothing written
