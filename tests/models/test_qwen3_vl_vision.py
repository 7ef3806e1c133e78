"""Qwen3-VL vision tower: parity with transformers' `Qwen3VLVisionModel` (fp32, tiny random config, the
pixels laid out by transformers' own Qwen2-VL patchify), the position and rotary tables, config checks."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx

from dlr_jax.config import ConfigError
from dlr_jax.convert.qwen3_vl_vision import load_state_dict
from dlr_jax.core.sharding import make_mesh, state_shardings
from dlr_jax.models.qwen3_vl_vision import (
    TINY_QWEN3_VL_VISION,
    Qwen3VLVisionConfig,
    Qwen3VLVisionTower,
    bilinear_align_corners_matrix,
)
from tests.models.test_vision import numpy_build, randomize_

TOL = 1e-4


def hf_vision_config(cfg: Qwen3VLVisionConfig = TINY_QWEN3_VL_VISION, deepstack=(0,)):
    import transformers as tf

    hc = tf.Qwen3VLVisionConfig(
        depth=cfg.depth, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_heads=cfg.num_heads, patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size,
        spatial_merge_size=cfg.spatial_merge_size, out_hidden_size=cfg.out_hidden_size,
        num_position_embeddings=cfg.num_position_embeddings, deepstack_visual_indexes=list(deepstack),
        hidden_act=cfg.hidden_act,
    )
    hc._attn_implementation = "eager"
    return hc


def hf_pixel_values(cfg: Qwen3VLVisionConfig, images: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """NHWC images -> (pixel_values [b * h * w, c * t * p * p], grid_thw), by transformers' processor code."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rows, grids = [], []
    for image in images:
        patches, gh, gw = Qwen2VLImageProcessorPil.patchify(
            None, image.transpose(2, 0, 1), cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size)
        rows.append(patches)
        grids.append([1, gh, gw])
    return torch.from_numpy(np.concatenate(rows)), torch.tensor(grids)


def to_merge_block_order(cfg: Qwen3VLVisionConfig, x: np.ndarray) -> np.ndarray:
    """[b, h, w, d] row-major patches -> [b * h * w, d] in HF's order (merge blocks, then patches in a block)."""
    b, h, w, d = x.shape
    m = cfg.spatial_merge_size
    return x.reshape(b, h // m, m, w // m, m, d).transpose(0, 1, 3, 2, 4, 5).reshape(-1, d)


@pytest.fixture(scope="module")
def pair():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    torch.manual_seed(0)
    ref = Qwen3VLVisionModel(hf_vision_config()).eval()
    randomize_(ref, 1)
    ours = numpy_build(lambda: Qwen3VLVisionTower(TINY_QWEN3_VL_VISION, rngs=nnx.Rngs(0)))  # values overwritten
    load_state_dict(ours, ref.state_dict())
    return ref, ours


_run = jax.jit(lambda m, x: (m.features(x), m(x)))


def reference(ref, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pv, grid = hf_pixel_values(TINY_QWEN3_VL_VISION, images)
    with torch.no_grad():
        out = ref(pv, grid_thw=grid)
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


# 32 x 32: an 8 x 8 patch grid (the 4 x 4 table grows); 24 x 40: a non-square 6 x 10 grid, so swapped
# row/column handling (positions, rotary angles, merge order) would show.
@pytest.mark.parametrize(("height", "width"), [(32, 32), (24, 40)])
def test_tower_matches_transformers(pair, height, width):
    ref, ours = pair
    cfg = TINY_QWEN3_VL_VISION
    x = np.random.default_rng(height + width).uniform(-1, 1, (2, height, width, 3)).astype(np.float32)
    want_feat, want = reference(ref, x)
    got_feat, got = map(np.asarray, _run(ours, jnp.asarray(x)))
    assert got.shape == (2, cfg.num_tokens(height, width), cfg.out_hidden_size)
    assert np.abs(want).max() > 0.1  # a degenerate all-zero comparison would pass trivially
    chex.assert_trees_all_close(
        {"features": to_merge_block_order(cfg, got_feat), "tokens": got.reshape(-1, cfg.out_hidden_size)},
        {"features": want_feat, "tokens": want}, atol=TOL, rtol=0)


def test_a_wrong_weight_fails_the_parity_check(pair):
    """The comparison above sees a mislaid tensor: q and k swapped inside qkv moves the tokens past TOL."""
    ref, _ = pair
    sd = dict(ref.state_dict())
    d = TINY_QWEN3_VL_VISION.hidden_size
    qkv = sd["blocks.0.attn.qkv.weight"]
    sd["blocks.0.attn.qkv.weight"] = torch.cat([qkv[d:2 * d], qkv[:d], qkv[2 * d:]])
    bad = numpy_build(lambda: Qwen3VLVisionTower(TINY_QWEN3_VL_VISION, rngs=nnx.Rngs(0)))
    load_state_dict(bad, sd)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    _, want = reference(ref, x)
    assert np.abs(np.asarray(_run(bad, jnp.asarray(x))[1]).reshape(want.shape) - want).max() > 10 * TOL


@pytest.mark.parametrize(("n_in", "n_out"), [(4, 8), (4, 6), (48, 10), (4, 1), (4, 4)])
def test_position_resize_matches_torch_bilinear_align_corners(n_in, n_out):
    x = np.random.default_rng(n_in * 100 + n_out).standard_normal((1, 3, n_in, n_in))
    want = F.interpolate(torch.from_numpy(x), size=(n_out, n_out), mode="bilinear", align_corners=True).numpy()
    m = bilinear_align_corners_matrix(n_in, n_out)
    np.testing.assert_allclose(np.einsum("ph,bchw,qw->bcpq", m, x, m), want, atol=1e-10)


def test_token_counts_and_bad_images():
    cfg = Qwen3VLVisionConfig()  # Qwen3-VL: patch 16, 2 x 2 merge
    assert [cfg.num_tokens(s) for s in (64, 128, 256, 1024)] == [4, 16, 64, 1024]  # (side / 32)^2
    tower = numpy_build(lambda: Qwen3VLVisionTower(TINY_QWEN3_VL_VISION, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="NHWC"):
        tower(jnp.zeros((1, 3, 32, 32)))
    with pytest.raises(ValueError, match="multiples of patch_size x spatial_merge_size = 8"):
        tower(jnp.zeros((1, 36, 36, 3)))


def test_config_validation():
    with pytest.raises(ConfigError, match="not divisible"):
        dataclasses.replace(TINY_QWEN3_VL_VISION, hidden_size=33)
    with pytest.raises(ConfigError, match="multiple of 4"):
        dataclasses.replace(TINY_QWEN3_VL_VISION, hidden_size=36, num_heads=6)
    with pytest.raises(ConfigError, match="square"):
        dataclasses.replace(TINY_QWEN3_VL_VISION, num_position_embeddings=12)
    with pytest.raises(ConfigError, match="hidden_act"):
        dataclasses.replace(TINY_QWEN3_VL_VISION, hidden_act="relu")


def test_params_carry_logical_axes_known_to_the_sharding_rules():
    abstract = nnx.eval_shape(lambda: Qwen3VLVisionTower(TINY_QWEN3_VL_VISION, rngs=nnx.Rngs(0)))
    state = nnx.state(abstract, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        axes = var.get_metadata().get("logical_axes")
        assert axes is not None and len(axes) == len(var.get_value().shape), path
    shardings = state_shardings(state, make_mesh(data=1, fsdp=4, tensor=2))  # KeyError on an unknown name
    assert shardings["blocks"]["fc1"].spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
