"""HF <-> dlr_jax conversion: logit parity both ways on tiny random models, Orbax, CLI, errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file

from dlr_jax import convert
from dlr_jax.convert import ConversionError, load_hf, load_orbax, save_hf, save_orbax, tensors
from dlr_jax.convert import cli as convert_cli
from dlr_jax.core.sharding import make_mesh, max_bytes_on_one_device, sharded_fraction
from tests.hf_fixtures import FAMILIES, LLAMA3_ROPE, build_tiny_hf, hf_logits, random_ids, save_tiny_hf
from tests.xla_env import xla_flags

TOL = 1e-4
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """One saved tiny checkpoint per family, shared by the tests of this module."""
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(fam)
        out[fam] = (d, save_tiny_hf(fam, d))
    return out


def _ours(model, ids) -> np.ndarray:
    return np.asarray(model(jax.numpy.asarray(ids)))


@pytest.fixture(scope="module")
def imported(hf_dirs) -> dict[str, tuple]:
    """family -> (config, model, ids, our logits), imported once with `load_hf`."""
    out = {}
    for fam, (d, _) in hf_dirs.items():
        cfg, model = load_hf(d)
        ids = random_ids(cfg.vocab_size)
        out[fam] = (cfg, model, ids, _ours(model, ids))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_load_hf_matches_transformers_logits(hf_dirs, imported, family):
    cfg, _, ids, ours = imported[family]
    assert cfg.model_type == family
    err = np.abs(ours - hf_logits(hf_dirs[family][1], ids)).max()
    assert err <= TOL, f"{family}: max |logit diff| {err}"


def test_config_fields_per_family(hf_dirs, imported):
    llama = imported["llama"][0]
    assert llama.tie_embeddings and llama.rope_theta == 500000.0
    assert dict(llama.rope_scaling) == LLAMA3_ROPE
    qwen2 = convert.model_config_from_hf(hf_dirs["qwen2"][0])
    assert qwen2.attention_bias and not qwen2.qk_norm and not qwen2.tie_embeddings
    qwen3 = convert.model_config_from_hf(hf_dirs["qwen3"][0] / "config.json", remat="full", scan_layers="scan")
    assert qwen3.qk_norm and qwen3.head_dim == 32 and qwen3.remat == "full" and qwen3.scan_layers == "scan"
    vl = convert.model_config_from_hf(hf_dirs["qwen3_vl"][0])
    assert vl.qk_norm and vl.rope_theta == 5e6 and vl.rope_scaling is None and vl.num_layers == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_save_hf_round_trip_through_transformers(imported, family, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg, model, ids, ours = imported[family]
    save_hf(model, cfg, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == ("qwen3" if family == "qwen3_vl" else family)
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    err = np.abs(hf_logits(back, ids) - ours).max()
    assert err <= TOL, f"{family}: max |logit diff| after --to-hf {err}"
    # And back again: the exported checkpoint imports to identical params.
    _, again = load_hf(tmp_path)
    _assert_same_params(model, again)


def test_old_style_rope_scaling_config_loads(hf_dirs, tmp_path):
    src, hf = hf_dirs["llama"]
    raw = json.loads((src / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw["rope_theta"] = rope.pop("rope_theta")
    raw["rope_scaling"] = rope  # published Llama-3.x checkpoints look like this
    (tmp_path / "config.json").write_text(json.dumps(raw))
    os.symlink(src / "model.safetensors", tmp_path / "model.safetensors")
    cfg, model = load_hf(tmp_path)
    assert cfg.rope_theta == 500000.0 and dict(cfg.rope_scaling) == LLAMA3_ROPE
    ids = random_ids(cfg.vocab_size)
    assert np.abs(_ours(model, ids) - hf_logits(hf, ids)).max() <= TOL


def test_bf16_checkpoint_and_sharded_index(tmp_path):
    """bf16 safetensors (numpy has no native bf16) and a multi-file index both import exactly."""
    hf = build_tiny_hf("qwen2")
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", max_shard_size="40KB")
    assert (tmp_path / "bf16" / "model.safetensors.index.json").is_file()
    cfg, model = load_hf(tmp_path / "bf16", dtype="float32")
    want = hf.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()  # [H*hd, d]
    got = np.asarray(model.layers.q_proj[1]).reshape(cfg.hidden_size, -1).T
    np.testing.assert_array_equal(got, want)
    save_hf(model, cfg, tmp_path / "out", dtype="bfloat16", max_shard_bytes=30_000)
    assert len(list((tmp_path / "out").glob("*.safetensors"))) > 1
    _, back = load_hf(tmp_path / "out", dtype="bfloat16")
    assert back.layers.q_proj[...].dtype == jax.numpy.bfloat16
    np.testing.assert_array_equal(np.asarray(back.layers.q_proj[...], np.float32), model.layers.q_proj[...])
    first = sorted((tmp_path / "bf16").glob("*.safetensors"))[0]
    name = next(iter(load_file(first)))
    np.testing.assert_array_equal(tensors.read_raw(first, name), load_file(first)[name])


def _assert_same_params(a, b) -> None:
    fa, fb = nnx.to_flat_state(nnx.state(a, nnx.Param)), nnx.to_flat_state(nnx.state(b, nnx.Param))
    assert [p for p, _ in fa] == [p for p, _ in fb]
    for (p, va), (_, vb) in zip(fa, fb, strict=True):
        np.testing.assert_array_equal(np.asarray(va.get_value()), np.asarray(vb.get_value()), err_msg=str(p))


def _need_devices(n: int) -> None:
    if jax.device_count() < n:
        pytest.skip(f"needs {n} devices, have {jax.device_count()} (set "
                    "XLA_FLAGS=--xla_force_host_platform_device_count=8 before importing jax)")


def test_orbax_round_trip_onto_a_mesh(imported, tmp_path):
    _need_devices(2)
    cfg, model, _, _ = imported["qwen3"]
    save_orbax(model, cfg, tmp_path / "ck")
    with pytest.raises(ConversionError, match="already exists"):
        save_orbax(model, cfg, tmp_path / "ck")
    mesh = make_mesh(1, 2, 1, devices=jax.devices()[:2])
    cfg2, restored = load_orbax(tmp_path / "ck", mesh=mesh)
    assert cfg2 == cfg
    _assert_same_params(model, restored)
    assert restored.layers.q_proj[...].sharding.mesh.shape["fsdp"] == 2
    assert sharded_fraction(nnx.state(restored, nnx.Param)) > 0.5


def test_sharded_import_never_materialises_a_full_tensor(tmp_path, monkeypatch):
    _need_devices(8)
    save_tiny_hf("llama", tmp_path, tie_word_embeddings=False, intermediate_size=128, vocab_size=128)
    calls: list[tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, ...]]]] = []  # full, shard, got
    put_shapes: list[tuple[int, ...]] = []
    real_cb, real_put = jax.make_array_from_callback, jax.device_put

    def spy_cb(shape, sharding, cb, *a, **k):
        got: list[tuple[int, ...]] = []
        calls.append((tuple(shape), tuple(sharding.shard_shape(shape)), got))

        def wrapped(idx):
            chunk = cb(idx)
            got.append(tuple(chunk.shape))
            return chunk

        return real_cb(shape, sharding, wrapped, *a, **k)

    def spy_put(x, *a, **k):
        put_shapes.extend(tuple(leaf.shape) for leaf in jax.tree.leaves(x) if hasattr(leaf, "shape"))
        return real_put(x, *a, **k)

    monkeypatch.setattr(jax, "make_array_from_callback", spy_cb)
    monkeypatch.setattr(jax, "device_put", spy_put)
    cfg, model = load_hf(tmp_path, mesh=make_mesh(1, 8, 1))
    params = nnx.state(model, nnx.Param)
    leaves = jax.tree.leaves(params)
    assert sharded_fraction(params) >= 0.95
    assert len(calls) == len(leaves)  # every param was placed through the per-shard callback
    n_sharded = 0
    for full, shard, got in calls:
        if shard != full:
            n_sharded += 1
            assert got == [shard] * 8, f"param {full}: devices received {got}, its shard is {shard}"
    assert n_sharded >= len(leaves) - 3  # all but the norms
    sharded_full = {tuple(x.shape) for x in leaves if x.sharding.shard_shape(x.shape) != x.shape}
    assert not sharded_full & set(put_shapes), "a full sharded tensor was device_put"
    biggest = max(x.nbytes for x in leaves)
    assert max_bytes_on_one_device(params) <= biggest // 8
    ids = random_ids(cfg.vocab_size, (8, 16))
    ref = AutoModelForCausalLM_logits(tmp_path, ids)
    assert np.abs(_ours(model, ids) - ref).max() <= TOL


def AutoModelForCausalLM_logits(path: Path, ids: np.ndarray) -> np.ndarray:  # noqa: N802
    from transformers import AutoModelForCausalLM

    return hf_logits(AutoModelForCausalLM.from_pretrained(path).eval(), ids)


def test_cli_end_to_end(hf_dirs, tmp_path):
    src, hf = hf_dirs["qwen2"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(2))
    run = lambda *a: subprocess.run([sys.executable, "-m", "dlr_jax.convert", *a], cwd=REPO, env=env,
                                    capture_output=True, text=True, timeout=120)
    r = run("--from-hf", str(src), "--out", str(tmp_path / "ck"), "--mesh", "data=1,fsdp=2,tensor=1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "ck" / "model_config.json").is_file()
    r = run("--to-hf", "--from-orbax", str(tmp_path / "ck"), "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-3000:]
    ids = random_ids(hf.config.vocab_size, seed=3)
    assert np.abs(AutoModelForCausalLM_logits(tmp_path / "hf", ids) - hf_logits(hf, ids)).max() <= TOL
    r = run("--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--from-hf" in r.stderr
    r = run("--from-hf", str(src), "--out", str(tmp_path / "y"), "--mesh", "data=1,fsdp=8,tensor=1")  # 2 devices
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        "error: --mesh data=1,fsdp=8,tensor=1: mesh {'data': 1, 'fsdp': 8, 'tensor': 1} needs 8 devices, have 2")


def test_cli_help_explains_both_directions(capsys):
    with pytest.raises(SystemExit) as e:
        convert_cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--from-hf" in text and "--to-hf" in text and "--from-orbax" in text and "qwen3_vl" in text


# ----------------------------------------------------------------------------------------------
# Errors name the file and the tensor.


def _copy_ckpt(src: Path, dst: Path, edit=None) -> Path:
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    if edit:
        edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_missing_config_json(tmp_path):
    with pytest.raises(ConversionError) as e:
        load_hf(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConversionError) as e:
        convert.model_config_from_hf(tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "config.json") in msg and "'gpt2'" in msg
    assert all(f in msg for f in FAMILIES)


def test_missing_tensor(hf_dirs, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    d = _copy_ckpt(hf_dirs["qwen3"][0], tmp_path / "m", lambda t: t.pop(name))
    with pytest.raises(ConversionError) as e:
        load_hf(d)
    assert name in str(e.value) and str(d) in str(e.value)


def test_shape_mismatch(hf_dirs, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    d = _copy_ckpt(hf_dirs["qwen2"][0], tmp_path / "m", lambda t: t.update({name: t[name][:-1]}))
    with pytest.raises(ConversionError) as e:
        load_hf(d)
    msg = str(e.value)
    assert str(d / "model.safetensors") in msg and name in msg and "(31, 64)" in msg and "(32, 64)" in msg


def test_unexpected_tensor_and_untied_head(hf_dirs, tmp_path):
    src = hf_dirs["llama"][0]
    extra = "model.layers.5.mlp.up_proj.weight"
    up0 = "model.layers.0.mlp.up_proj.weight"
    d = _copy_ckpt(src, tmp_path / "extra", lambda t: t.update({extra: t[up0]}))
    with pytest.raises(ConversionError, match=extra.replace(".", r"\.")):
        load_hf(d)

    def add_head(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"] + 1.0

    d = _copy_ckpt(src, tmp_path / "head", add_head)
    with pytest.raises(ConversionError, match="lm_head.weight.*tie_word_embeddings"):
        load_hf(d)
    _, equal = load_hf(_copy_ckpt(src, tmp_path / "same", lambda t: t.update(
        {"lm_head.weight": t["model.embed_tokens.weight"]})))
    assert not hasattr(equal, "lm_head") and math.isfinite(float(np.asarray(equal.embed[...]).sum()))
