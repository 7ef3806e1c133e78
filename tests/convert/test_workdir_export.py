"""--to-hf safety (non-empty dirs, stale shards, truncated / non-finite tensors) and a trained latent
stage exported as a standard HF checkpoint: `transformers` greedy generate == our sampler's."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

from dlr_jax import convert
from dlr_jax.convert import cli as convert_cli
from dlr_jax.convert.workdir_export import prepare_out_dir
from dlr_jax.data.sources import load_examples
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.run.handoff import load_stage_model, save_stage_model
from tests.hf_fixtures import hf_logits, random_ids, save_tiny_hf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    model = save_tiny_hf("qwen2", d)
    return d, model


def test_to_hf_refuses_a_non_empty_dir_and_force_removes_stale_shards(tiny_hf, tmp_path):
    src, hf = tiny_hf
    ck = tmp_path / "ck"
    convert_cli.main(["--from-hf", str(src), "--out", str(ck), "--mesh", "data=1,fsdp=1,tensor=1"])
    out = tmp_path / "out"
    out.mkdir()
    # what an earlier, sharded export of another model left behind
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old")
    (out / "model-00002-of-00002.safetensors").write_bytes(b"old")
    index = {"weight_map": {"x": "model-00001-of-00002.safetensors"}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not empty .*--force"):
        convert_cli.main(["--to-hf", "--from-orbax", str(ck), "--out", str(out), "--mesh", "data=1,fsdp=1,tensor=1"])
    convert_cli.main(["--to-hf", "--from-orbax", str(ck), "--out", str(out), "--force",
                      "--mesh", "data=1,fsdp=1,tensor=1"])
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" not in names and not any(n.startswith("model-0") for n in names)
    assert "notes.txt" in names  # not ours: left alone
    _, ours = convert.load_hf(out)  # our reader sees the new weights only
    ids = random_ids(hf.config.vocab_size, seed=1)
    np.testing.assert_allclose(np.asarray(ours(ids)), hf_logits(hf, ids), atol=1e-4)


def test_prepare_out_dir_accepts_new_and_empty_dirs(tmp_path):
    assert prepare_out_dir(tmp_path / "new", force=False).is_dir()
    assert prepare_out_dir(tmp_path / "new", force=False).is_dir()  # empty now


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_truncated_safetensors_is_a_one_line_error_with_the_path(tiny_hf, tmp_path):
    d = _copy(tiny_hf[0], tmp_path / "cut")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ConversionError) as e:
        convert.load_hf(d)
    assert str(f) in str(e.value) and "truncated" in str(e.value) and "\n" not in str(e.value)


def test_non_finite_tensor_names_path_and_tensor(tiny_hf, tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy(tiny_hf[0], tmp_path / "nan")
    f = d / "model.safetensors"
    tensors = load_file(str(f))
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name][3, 5] = np.nan
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=rf"{f}: tensor '{name}' has 1 non-finite value"):
        convert.load_hf(d)


# ------------------------------------------------------------------------------------------------
# A latent stage out to HF.

MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=60", "data.synthetic_eval=20",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=32",
    "latent.latent_dim=16", "latent.source=random", "mesh.fsdp=1",
]


@pytest.fixture(scope="module")
def sft_workdir(tmp_path_factory):
    """A workdir whose sft/final is a random latent LM, written in the stages' own formats
    (test_stages.py trains these; the export only reads them)."""
    from dlr_jax.config import load_config
    from dlr_jax.core.sharding import make_mesh
    from dlr_jax.stages import common
    from dlr_jax.stages.latent_common import new_latent_lm

    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO)
    w = tmp_path_factory.mktemp("wd")
    common.prepare_workdir(cfg, w)
    tok = common.get_tokenizer(cfg, w, load_examples(cfg, "train"))
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    backbone = common.new_backbone(cfg, tok, mesh)
    save_stage_model(backbone, w, "textsft_cot", kind="backbone", model_cfg=backbone.cfg)
    lm = new_latent_lm(cfg, w, tok, mesh)
    # A fresh micro LM (std 0.02 everywhere) greedily repeats one token; these weights (layers at
    # ~1/sqrt(d), latent output rows scaled to compete with the text rows) give outputs that switch
    # between text and latent ids, so both kinds of row are compared (checked below).
    from flax import nnx

    for path, var in nnx.to_flat_state(nnx.state(lm.backbone, nnx.Param)):
        if path[0] == "layers" and var.get_value().ndim >= 3:
            var.set_value(var.get_value() * 8.0)
    lm.backbone.embed.set_value(lm.backbone.embed[...] * 2.0)
    lm.p_out.kernel.set_value(lm.p_out.kernel[...] * 0.1)
    lm.p_out.bias.set_value(lm.p_out.bias[...] * 0.0)
    save_stage_model(lm, w, "sft", kind="latent_lm", model_cfg=lm.model_cfg)
    return cfg, w, tok


@pytest.mark.slow
def test_exported_latent_lm_generates_like_our_sampler(sft_workdir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dlr_jax.core.sharding import make_mesh
    from dlr_jax.data.formats import prompt_ids
    from dlr_jax.generate.sampler import Sampler

    cfg, w, tok = sft_workdir
    out = tmp_path / "hf"
    assert convert_cli.main(["--to-hf", "--from-workdir", str(w), "--stage", "sft", "--out", str(out)]) is None
    lm = load_stage_model(w, "sft", mesh=make_mesh(1, 1, 1, devices=jax.devices()[:1]))[0]
    questions = [ex.question for ex in load_examples(cfg, "test")[:8]]
    prompts = [prompt_ids(tok, q) for q in questions]
    n_new = 24
    ours = Sampler(lm, prompt_bucket=16).generate(prompts, max_new_tokens=n_new, temperature=0.0,
                                                   stop_ids=[tok.answer_end_id, tok.eos_id], pad_id=tok.pad_id)

    hf_tok = AutoTokenizer.from_pretrained(out)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert hf.config.vocab_size == tok.total_vocab_size
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.answer_end_id, tok.eos_id]  # stops where our sampler stops
    assert set(gen["suppress_tokens"]) == set(np.flatnonzero(~lm.vocab_mask()).tolist())
    latent_seen = text_seen = 0
    for r, p in enumerate(prompts):
        text = tok.decode(p)
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == p, text  # the exported tokenizer
        with torch.no_grad():
            g = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                            max_new_tokens=n_new)[0, len(p):].tolist()
        mine = ours.tokens[r, : ours.lengths[r]].tolist()
        assert g[: len(mine)] == mine, (r, g, mine)
        latent_seen += sum(tok.is_latent(t) for t in mine)
        text_seen += sum(not tok.is_latent(t) for t in mine)
        if mine and mine[-1] in (tok.answer_end_id, tok.eos_id):
            assert len(g) == len(mine)  # HF stopped at the same token
        assert hf_tok.decode(mine) == tok.decode(mine)  # <z_k> and boundary tokens print alike
    print(f"greedy outputs: {latent_seen} latent and {text_seen} text tokens")
    assert latent_seen > 0 and text_seen > 0, "outputs must visit latent and text rows for the test to check both"


def test_to_hf_refuses_a_non_finite_parameter(tiny_hf, tmp_path):
    _, model = convert.load_hf(tiny_hf[0])
    cfg = model.cfg
    model.final_norm.set_value(model.final_norm[...].at[0].set(np.inf))
    with pytest.raises(ConversionError, match="tensor 'final_norm' has 1 non-finite value"):
        convert.save_hf(model, cfg, tmp_path / "out")


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_an_out_inside_equal_to_or_above_the_source_is_refused_before_anything_is_removed(sft_workdir, tiny_hf):
    """`--out W/sft/final --force` deleted the trained stage (final/params), then the export failed."""
    _, w, _ = sft_workdir
    before = _files(w)
    for out, how in ((w / "sft" / "final", "is inside"), (w, "is"), (w.parent, "holds")):
        with pytest.raises(SystemExit, match=f"error: --out {out} {how} the source {w}: choose an output directory "
                                             "outside it"):
            convert_cli.main(["--to-hf", "--from-workdir", str(w), "--stage", "sft", "--out", str(out), "--force"])
    assert _files(w) == before
    src = tiny_hf[0]
    hf_before = _files(src)
    with pytest.raises(SystemExit, match="is inside the source"):
        convert_cli.main(["--from-hf", str(src), "--out", str(src / "orbax"), "--force"])
    assert _files(src) == hf_before and not (src / "orbax").exists()
    with pytest.raises(SystemExit, match=f"--out {src} is the source"):
        convert_cli.main(["--to-hf", "--from-orbax", str(src), "--out", str(src), "--force"])
    assert _files(src) == hf_before


def test_force_clears_the_old_export_only_after_the_source_is_read(sft_workdir, tmp_path):
    import shutil

    _, w, _ = sft_workdir
    broken = tmp_path / "w"
    shutil.copytree(w, broken)
    (broken / "sft" / "final" / "params" / "manifest.ocdbt").unlink()  # a damaged source
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text("{}")  # an earlier export
    (out / "model.safetensors").write_bytes(b"old")
    with pytest.raises(SystemExit, match=r"error: .*sft/final/params: does not restore"):
        convert_cli.main(["--to-hf", "--from-workdir", str(broken), "--stage", "sft", "--out", str(out), "--force"])
    assert _files(out) == {"config.json": b"{}", "model.safetensors": b"old"}
