"""One fast path through textsft -> align -> sft on a micro config (random latent ids)."""

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import load_config
from dlr_jax.run.checkpoint import read_meta
from dlr_jax.run.handoff import load_stage_model
from dlr_jax.stages import align, sft, textsft

ROOT = Path(__file__).resolve().parents[2]
MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=120", "data.synthetic_eval=20",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=32",
    "latent.latent_dim=16", "latent.source=random", "mesh.fsdp=1",
]
for s in ("textsft", "align", "sft"):
    MICRO += [f"train.{s}.batch_size=8", f"train.{s}.num_steps=2", f"train.{s}.progress=false",
              f"train.{s}.async_checkpointing=false", f"train.{s}.learning_rate=1e-2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO)
    w = tmp_path_factory.mktemp("wd")
    textsft.run(cfg, w, "cot")
    before = load_stage_model(w, "textsft_cot", mesh=_one())[0]
    align.run(cfg, w)
    sft.run(cfg, w)
    return cfg, w, before


def _one():
    from dlr_jax.core.sharding import make_mesh

    return make_mesh(1, 1, 1, devices=jax.devices()[:1])


def _flat(state):
    return {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(state)}


def test_workdir_layout(run_dir):
    _, w, _ = run_dir
    for p in ("config.yaml", "tokenizer/tokenizer.json", "textsft_cot/final/meta.json", "align/final/meta.json",
              "sft/final/meta.json", "sft/metrics.jsonl"):
        assert (w / p).exists(), p
    assert read_meta(w / "sft" / "final")["kind"] == "latent_lm"


def test_align_changes_only_projectors(run_dir):
    _, w, backbone_before = run_dir
    aligned = _flat(nnx.state(load_stage_model(w, "align", mesh=_one())[0], nnx.Param))
    start = _flat(nnx.state(backbone_before, nnx.Param))
    for k, v in start.items():  # every backbone tensor is bit-identical after align
        np.testing.assert_array_equal(aligned["backbone/" + k], v)
    assert any(k.startswith("p_in") for k in aligned)


def test_sft_trains_backbone_and_projectors(run_dir):
    _, w, _ = run_dir
    a = _flat(nnx.state(load_stage_model(w, "align", mesh=_one())[0], nnx.Param))
    s = _flat(nnx.state(load_stage_model(w, "sft", mesh=_one())[0], nnx.Param))
    changed = {k for k in a if not np.array_equal(a[k], s[k])}
    assert any(k.startswith("backbone/layers") for k in changed)
    assert any(k.startswith("p_in") or k.startswith("p_out") for k in changed)


def test_sft_model_emits_full_vocab_logits(run_dir):
    _, w, _ = run_dir
    model, tok, _ = load_stage_model(w, "sft", mesh=_one())
    logits = model(np.asarray([[tok.bos_id or 1, tok.latent_start_id, tok.latent_id(3)]]))
    assert logits.shape[-1] == tok.total_vocab_size


def test_train_cli_help_and_bad_override(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dlr_jax.train", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "--stage" in out.stdout and "align" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "dlr_jax.train", "--stage", "align", "--workdir", str(tmp_path), "--set", "nope=1"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert bad.returncode == 2 and "unknown key" in bad.stderr
    # no --config and nothing recorded (CONFIG - on a mistyped workdir): refused, not the built-in defaults
    from dlr_jax import train
    assert train.main(["--stage", "align", "--workdir", str(tmp_path / "typo")]) == 2
    assert not (tmp_path / "typo").exists()


def test_a_missing_earlier_stage_is_one_error_line_naming_the_command(tmp_path, capsys):
    from dlr_jax import train
    w = tmp_path / "w"
    code = train.main(["--config", str(ROOT / "configs" / "tiny.yaml"), "--stage", "align", "--workdir", str(w),
                       "--set", "data.synthetic_train=64", "--set", "data.synthetic_eval=8"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    assert f"--stage textsft --mode cot --workdir {w}` first" in err
    ev = subprocess.run([sys.executable, "-m", "dlr_jax.evaluate", "--workdir", str(w), "--stage", "sft"],
                        capture_output=True, text=True, cwd=ROOT)
    assert ev.returncode == 2 and ev.stderr.startswith("error: ") and "Traceback" not in ev.stderr
    assert f"--stage sft --workdir {w}` first" in ev.stderr


def test_direct_from_cot_starts_from_the_cot_sft_model(run_dir, tmp_path, monkeypatch):
    import dlr_jax.data.pipeline as pipeline

    cfg, w, _ = run_dir
    with pytest.raises(FileNotFoundError, match="textsft_cot/final: direct_from_cot starts from the CoT-SFT model"):
        textsft.run(cfg, tmp_path / "empty", "direct_from_cot")
    # the runner's layout: the control's workdir links the CoT-SFT model and the tokenizer
    ctl_dir = tmp_path / "control"
    ctl_dir.mkdir()
    for name in ("textsft_cot", "tokenizer"):
        (ctl_dir / name).symlink_to(w / name)
    modes = []
    make = pipeline.make_stage_dataset
    monkeypatch.setattr(pipeline, "make_stage_dataset", lambda *a, **k: modes.append(k["mode"]) or make(*a, **k))
    # at learning rate 0 the control's model is exactly the CoT-SFT model it started from
    frozen = load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "train.textsft_direct.learning_rate=0.0",
                                                          "train.textsft_direct.num_steps=1"])
    textsft.run(frozen, ctl_dir, "direct_from_cot")
    assert modes == ["direct"]  # answer-only rows, as Direct-SFT
    assert read_meta(ctl_dir / "textsft_direct_from_cot" / "final")["mode"] == "direct_from_cot"
    cot = _flat(nnx.state(load_stage_model(w, "textsft_cot", mesh=_one())[0], nnx.Param))
    ctl = _flat(nnx.state(load_stage_model(ctl_dir, "textsft_direct_from_cot", mesh=_one())[0], nnx.Param))
    assert cot.keys() == ctl.keys()
    for k, v in cot.items():
        np.testing.assert_array_equal(ctl[k], v)
