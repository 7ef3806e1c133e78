"""codebook.encoder=qwen3_vl: the config's validation, the from-scratch model's token count, and the stage
training 2 steps with the tower imported from a tiny random qwen3_vl checkpoint (tests/hf_fixtures.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model
from dlr_jax.models.qwen3_vl_encoder import Qwen3VLEncoderConfig
from dlr_jax.stages.codebook import stage as codebook
from dlr_jax.stages.codebook.models import load_codebook_model
from tests.hf_fixtures import save_tiny_hf
from tests.stages.codebook.test_stage import MICRO, ROOT


def _cfg(*extra):
    return load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, *extra])


QWEN = ["codebook.encoder=qwen3_vl", "codebook.train.num_steps=2", "codebook.alpha_steps=0",
        "codebook.warmup_steps=0", "codebook.warmup_whole_steps=0"]


def test_encoder_option_is_validated():
    with pytest.raises(ConfigError, match="codebook.encoder must be one of deepencoder|qwen3_vl"):
        _cfg("codebook.encoder=clip")
    with pytest.raises(ConfigError, match="needs codebook.encoder=qwen3_vl"):
        _cfg("codebook.encoder_from=/nowhere")
    with pytest.raises(ConfigError, match="brings its own encoder"):
        _cfg("codebook.encoder=qwen3_vl", "codebook.init_from=/nowhere")
    assert _cfg().codebook.encoder == "deepencoder"  # the paper's encoder stays the default


def test_from_scratch_tower_gives_one_code_per_64px_cell():
    cfg = _cfg(*QWEN)
    mcfg = CodebookModelConfig.from_config(cfg)
    assert isinstance(mcfg.encoder, Qwen3VLEncoderConfig)
    assert (mcfg.encoder.tower.patch_size, mcfg.encoder.tower.pos_side, mcfg.code_dim) == (16, 8, 16)
    assert CodebookModelConfig.from_dict(json.loads(json.dumps(mcfg.to_dict()))) == mcfg
    model = build_codebook_model(mcfg)
    images = np.random.default_rng(0).integers(0, 256, (2, 128, 128), dtype=np.uint8)
    h = np.asarray(model.encode(images))
    assert h.shape == (2, 4, 16) and np.all(np.isfinite(h))  # (128 / 64)^2 codes


@pytest.mark.slow  # an end-to-end stage run (compiles the train step, k-means features and greedy decoding)
def test_stage_trains_with_the_tower_of_a_qwen3_vl_checkpoint(tmp_path, compile_cache):
    hf = tmp_path / "qwen3_vl"
    save_tiny_hf("qwen3_vl", hf)  # vision: patch 8, 2 x 2 merge -> 4 x 4 merged tokens per 64-px cell
    w = tmp_path / "w"
    report = codebook.run(_cfg(*QWEN, f"codebook.encoder_from={hf}"), w)
    assert report["steps"] == 2 and math.isfinite(report["last_metrics"]["loss"])
    model = load_codebook_model(w)
    assert model.cfg.encoder.tower.patch_size == 8 and model.cfg.encoder.cell == 4
    assert report["held_out"]["mean_n"] == 4.0
