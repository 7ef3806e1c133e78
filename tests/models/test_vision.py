"""SAM ViT + neck + compressor: parity with transformers' DeepSeek-OCR-2 SAM encoder, resampling
matrices against torch, config validation, shapes and sharding metadata."""

from __future__ import annotations

import dataclasses
import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx
from jax.sharding import PartitionSpec

from dlr_jax.config import ConfigError
from dlr_jax.core.sharding import make_mesh, state_shardings
from dlr_jax.models.vision import (
    TINY_VISION,
    VisionConfig,
    VisionTower,
    bicubic_aa_matrix,
    linear_matrix,
    load_sam_state_dict,
    normalize_images,
    run_blocks,
    sam_block,
)

TOL = 1e-4


def hf_sam_config(cfg: VisionConfig = TINY_VISION):
    from transformers.models.deepseek_ocr2.configuration_deepseek_ocr2 import DeepseekOcr2SamVisionConfig

    hc = DeepseekOcr2SamVisionConfig(
        hidden_size=cfg.hidden_size, output_channels=cfg.neck_channels, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, image_size=cfg.image_size, patch_size=cfg.patch_size,
        global_attn_indexes=list(cfg.global_attn_indexes), window_size=cfg.window_size, mlp_dim=cfg.mlp_dim,
        downsample_channels=list(cfg.compressor_channels), layer_norm_eps=cfg.layer_norm_eps,
    )
    hc._attn_implementation = "eager"
    return hc


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """HF zero-initialises pos_embed / rel_pos and sets norms to 1 / 0: randomise everything so a
    dropped or transposed tensor shows up in the outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_((0.1 if p.ndim > 1 else 0.2) * noise)


def numpy_build(make, seed: int = 0):
    """The module `make` builds, with every parameter drawn from NumPy (norm weights near 1, the
    rest N(0, 0.1^2)). Skips jax.random's per-shape compilations, about a second each on this CPU;
    the real initialiser is exercised where a test builds a module directly."""
    graphdef, state = nnx.split(nnx.eval_shape(make))
    rng = np.random.default_rng(seed)

    def fill(path, x):
        noise = rng.standard_normal(x.shape).astype(x.dtype)
        is_norm = re.search(r"(norm|ln\d_w)$", str(path[-1].key if hasattr(path[-1], "key") else path[-1]))
        return jnp.asarray(1.0 + 0.1 * noise if is_norm else 0.1 * noise)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))


@pytest.fixture(scope="module")
def pair():
    from transformers.models.deepseek_ocr2.modeling_deepseek_ocr2 import DeepseekOcr2SamVisionEncoder

    torch.manual_seed(0)
    ref = DeepseekOcr2SamVisionEncoder(hf_sam_config()).eval()
    randomize_(ref, 1)
    ours = numpy_build(lambda: VisionTower(TINY_VISION, rngs=nnx.Rngs(0)))  # values overwritten
    load_sam_state_dict(ours, ref.state_dict())
    return ref, ours


def _hf_features(ref, px: torch.Tensor) -> np.ndarray:
    hs = ref.patch_embed(px)
    hs = hs + ref.interpolate_pos_encoding(hs.shape[1], hs.shape[2])
    for layer in ref.layers:
        hs = layer(hs)
    return hs.numpy()


_features_and_tokens = jax.jit(lambda m, a: (m.features(a), m(a)))


# 128 = reference size (grid 8, windows of 3 pad it to 9); 64 shrinks the pos-embed and global
# rel-pos tables (antialiased), 192 enlarges them and needs no window padding.
@pytest.mark.parametrize("side", [128, 64, 192])
def test_sam_encoder_matches_transformers(pair, side):
    ref, ours = pair
    x = np.random.default_rng(side).uniform(-1, 1, (2, side, side, 3)).astype(np.float32)
    px = torch.from_numpy(x).permute(0, 3, 1, 2)  # NHWC (ours) -> NCHW (torch)
    with torch.no_grad():
        want_feat = _hf_features(ref, px)
        want = ref(px).last_hidden_state.flatten(2).transpose(1, 2).numpy()
    got_feat, got = map(np.asarray, _features_and_tokens(ours, jnp.asarray(x)))
    assert got.shape == (2, TINY_VISION.num_tokens(side), TINY_VISION.out_channels)
    assert np.abs(want).max() > 0.1  # a degenerate all-zero comparison would pass trivially
    chex.assert_trees_all_close({"features": got_feat, "tokens": got}, {"features": want_feat, "tokens": want},
                                atol=TOL, rtol=0)


@pytest.mark.parametrize(("n_in", "n_out"), [(64, 8), (64, 12), (8, 4), (8, 12), (9, 5), (8, 8)])
def test_bicubic_matrix_matches_torch_antialiased_bicubic(n_in, n_out):
    x = np.random.default_rng(n_in * 100 + n_out).standard_normal((1, 3, n_in, n_in))
    want = F.interpolate(torch.from_numpy(x), size=(n_out, n_out), mode="bicubic", align_corners=False,
                         antialias=True).numpy()
    m = bicubic_aa_matrix(n_in, n_out)
    np.testing.assert_allclose(np.einsum("ph,bchw,qw->bcpq", m, x, m), want, atol=1e-10)


@pytest.mark.parametrize(("n_in", "n_out"), [(127, 15), (127, 23), (15, 7), (7, 15), (27, 27)])
def test_linear_matrix_matches_torch_linear(n_in, n_out):
    x = np.random.default_rng(n_in * 100 + n_out).standard_normal((1, 4, n_in))
    want = F.interpolate(torch.from_numpy(x), size=n_out, mode="linear").numpy()
    np.testing.assert_allclose(np.einsum("oi,bci->bco", linear_matrix(n_in, n_out), x), want, atol=1e-10)


def test_token_counts():  # output shapes are checked against them in the parity test
    for side, n in ((64, 1), (128, 4), (192, 9), (256, 16), (1024, 256)):
        assert TINY_VISION.num_tokens(side) == n == (side // 64) ** 2
    assert TINY_VISION.num_tokens(128, 192) == 6


def test_bad_images_raise_clear_errors():
    tower = numpy_build(lambda: VisionTower(TINY_VISION, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="NHWC"):
        tower(jnp.zeros((1, 3, 128, 128)))
    with pytest.raises(ValueError, match="multiples of patch_size=16"):
        tower(jnp.zeros((1, 120, 120, 3)))


def test_config_validation():
    VisionConfig()  # DeepEncoder V2: groups of 2 windowed + 1 global
    VisionConfig(num_layers=3, global_attn_indexes=())  # all windowed
    VisionConfig(num_layers=2, global_attn_indexes=(0, 1), window_size=0)  # all global
    with pytest.raises(ConfigError, match="groups of k windowed"):
        VisionConfig(global_attn_indexes=(2, 5, 9, 11))
    with pytest.raises(ConfigError, match="groups of k windowed"):
        VisionConfig(num_layers=13)  # a trailing windowed block after the last global one
    with pytest.raises(ConfigError, match="not divisible"):
        VisionConfig(hidden_size=100)


# The periodic layout (k windowed + 1 global) is checked against transformers' layer loop above.
@pytest.mark.parametrize(("n_layers", "globals_", "window"), [(2, (), 2), (2, (0, 1), 0)])
def test_degenerate_layouts_equal_blocks_in_layer_order(n_layers, globals_, window):
    """No global block (one plain scan) and no windowed block (groups of one global block) run
    the blocks in order."""
    cfg = dataclasses.replace(TINY_VISION, num_layers=n_layers, global_attn_indexes=globals_, window_size=window)
    tower = numpy_build(lambda: VisionTower(cfg, rngs=nnx.Rngs(0)))
    wp, gp = tower.windowed.arrays(), tower.global_.arrays()

    @jax.jit
    def in_layer_order(wp, gp, y):  # reference: an unrolled loop, block by block
        wi = gi = 0
        for layer in range(n_layers):
            if layer in globals_:
                y, gi = sam_block(cfg, {k: a[gi] for k, a in gp.items()}, y, 0), gi + 1
            else:
                y, wi = sam_block(cfg, {k: a[wi] for k, a in wp.items()}, y, window), wi + 1
        return y

    x = jnp.asarray(np.random.default_rng(3).standard_normal((1, 5, 5, cfg.hidden_size)), jnp.float32)
    got = jax.jit(functools.partial(run_blocks, cfg))(wp, gp, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(in_layer_order(wp, gp, x)), atol=1e-5, rtol=0)


def test_normalize_images_matches_processor_convention():
    px = np.array([[[[0, 128, 255]]]], np.uint8)
    want = [[[[-1.0, 128 / 127.5 - 1, 1.0]]]]
    np.testing.assert_allclose(np.asarray(normalize_images(px)), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(normalize_images(px.astype(np.float32) / 255)),
                               np.asarray(normalize_images(px)), atol=1e-6)


def test_params_carry_logical_axes_known_to_the_sharding_rules():
    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    abstract = nnx.eval_shape(lambda: VisionTower(TINY_VISION, rngs=nnx.Rngs(0)))
    state = nnx.state(abstract, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        axes = var.get_metadata().get("logical_axes")
        assert axes is not None and len(axes) == len(var.get_value().shape), path
    shardings = state_shardings(state, mesh)  # raises KeyError on a logical name without a rule
    # hidden_size 32 splits over fsdp=4: the ViT matrices really are sharded.
    assert shardings["windowed"]["fc1"].spec == PartitionSpec(None, "fsdp", "tensor")


def test_sam_global_attention_in_query_chunks_equals_the_whole():
    """`sam_attention` with a scores budget that forces chunks of grid rows (what a 1024-px canvas gets)
    gives the whole attention's outputs, with the real rel-pos tables and projections."""
    from dlr_jax.models.vision import SamBlocks, sam_attention

    cfg = TINY_VISION
    rs = np.random.default_rng(0)
    arrays = SamBlocks(cfg, 1, 8, rngs=nnx.Rngs(0)).arrays()
    p = {k: jnp.asarray(rs.standard_normal(v.shape[1:]) * 0.1, jnp.float32) for k, v in arrays.items()}
    x = jnp.asarray(rs.standard_normal((2, 8, 8, cfg.hidden_size)), jnp.float32)
    whole = jax.jit(lambda p, x: sam_attention(cfg, p, x, None))(p, x)
    budget = 2 * 2 * cfg.num_heads * 8 * 64  # two grid rows of queries per chunk
    chunked = jax.jit(lambda p, x: sam_attention(cfg, p, x, budget))(p, x)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)
