"""The Qwen3-VL vision tower out of a saved `qwen3_vl` checkpoint (tests/hf_fixtures.py's, the one the LM
import tests use): tokens equal transformers' `model.visual`; both tensor prefixes; bad checkpoints."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dlr_jax.convert.qwen3_vl_vision import load_qwen3_vl_vision, vision_config_from_hf
from dlr_jax.core.sharding import make_mesh
from dlr_jax.models.hf_config import ConversionError
from tests.hf_fixtures import save_tiny_hf
from tests.models.test_qwen3_vl_vision import hf_pixel_values

TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_vl")
    return path, save_tiny_hf("qwen3_vl", path)


def _rewrite(src, dst, rename=lambda n: n, extra=None):
    """A copy of the checkpoint with tensors renamed (and extra ones added)."""
    from safetensors.numpy import load_file, save_file

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = {rename(k): v for k, v in load_file(str(src / "model.safetensors")).items()}
    save_file(tensors | (extra or {}), str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_tower_from_checkpoint_matches_transformers(checkpoint):
    path, model = checkpoint
    cfg, tower = load_qwen3_vl_vision(path, mesh=make_mesh(data=1, fsdp=4, tensor=2))
    assert (cfg.depth, cfg.patch_size, cfg.out_hidden_size) == (1, 8, 64)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 48, 3)).astype(np.float32)
    pv, grid = hf_pixel_values(cfg, x)
    with torch.no_grad():
        want = model.model.visual(pv, grid_thw=grid).pooler_output.numpy()
    got = np.asarray(jax.jit(lambda m, a: m(a))(tower, jnp.asarray(x)))
    assert got.shape == (2, cfg.num_tokens(32, 48), 64) and np.abs(want).max() > 0.1
    np.testing.assert_allclose(got.reshape(want.shape), want, atol=TOL, rtol=0)


def test_old_prefix_and_bad_checkpoints(checkpoint, tmp_path):
    path, _ = checkpoint
    old = _rewrite(path, tmp_path / "old", lambda n: n.replace("model.visual.", "visual."))
    _, tower = load_qwen3_vl_vision(old)
    _, ref = load_qwen3_vl_vision(path)
    np.testing.assert_array_equal(np.asarray(tower.pos_embed[...]), np.asarray(ref.pos_embed[...]))

    extra = _rewrite(path, tmp_path / "extra", extra={"model.visual.blocks.1.norm1.weight": np.ones(32, np.float32)})
    with pytest.raises(ConversionError, match="unexpected vision tensor.*blocks.1.norm1"):
        load_qwen3_vl_vision(extra)
    cut = _rewrite(path, tmp_path / "cut", lambda n: n.replace("merger.linear_fc2", "merger.fc2"))
    with pytest.raises(ConversionError, match="lacks 'model.visual.merger.linear_fc2.weight'"):
        load_qwen3_vl_vision(cut)
    text = tmp_path / "text"
    text.mkdir()
    raw = json.loads((path / "config.json").read_text())
    (text / "config.json").write_text(json.dumps(raw["text_config"] | {"model_type": "qwen3"}))
    with pytest.raises(ConversionError, match="has no Qwen3-VL vision tower"):
        vision_config_from_hf(text)
