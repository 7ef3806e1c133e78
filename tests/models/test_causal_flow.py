"""Causal flow: parity with Qwen2Model under the hand-built hybrid mask and with DeepSeek-OCR-2's
vision model end to end; every query count runs; the mask's dependency structure; padding."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from dlr_jax.config import ConfigError
from dlr_jax.models.causal_flow import (
    TINY_ENCODER,
    TINY_FLOW,
    CausalFlow,
    CausalFlowConfig,
    Encoder,
    EncoderConfig,
    hybrid_mask,
    load_flow_state_dict,
    load_hf_vision_state_dict,
)
from dlr_jax.models.vision import TINY_VISION, normalize_images
from dlr_jax.text.render import render_cot
from tests.models.test_vision import hf_sam_config, numpy_build, randomize_

TOL = 1e-4
SHORT_COT = "<<48/2=24>> <<48+24=72>> so 72 clips in total"  # 128 px at 17 px font
LONG_COT = ("<<48/2=24>> <<48+24=72>> Natalia sold 48 clips in April and then half as many in May, "
            "so 72 clips in total were sold.")  # 192 px


def hf_flow_kwargs(cfg: CausalFlowConfig = TINY_FLOW) -> dict:
    return dict(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, vocab_size=16,
    )


# Jitted once at module level so calls with equal shapes share one compilation.
@functools.partial(nnx.jit, static_argnums=2)
def _hidden_jit(flow, v, n, visual_valid=None, query_valid=None):
    return flow.hidden_states(v, n, visual_valid=visual_valid, query_valid=query_valid)


def _hidden(flow: CausalFlow, v: jax.Array, n: int, **kw) -> np.ndarray:
    """Whole sequence [V ; Q], [b, nv + n, d]."""
    return np.asarray(_hidden_jit(flow, v, n, kw.get("visual_valid"), kw.get("query_valid")))


def _run(flow: CausalFlow, v: jax.Array, n: int, **kw) -> np.ndarray:
    """Query side only, as `flow(v, n)` returns it."""
    return _hidden(flow, v, n, **kw)[:, v.shape[1]:]


def _normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


_encode = nnx.jit(lambda model, images: model(images))


@pytest.fixture(scope="module")
def flow() -> CausalFlow:
    return numpy_build(lambda: CausalFlow(TINY_FLOW, rngs=nnx.Rngs(0)), seed=3)


def test_flow_matches_qwen2_with_hand_built_hybrid_mask():
    import transformers as tf

    torch.manual_seed(0)
    ref = tf.Qwen2Model(tf.Qwen2Config(**hf_flow_kwargs(), attn_implementation="eager")).eval()
    randomize_(ref, 2)
    ours = numpy_build(lambda: CausalFlow(TINY_FLOW, rngs=nnx.Rngs(0)))  # every value is overwritten
    load_flow_state_dict(ours, ref.state_dict())
    b, nv, n = 2, 9, 6
    rng = np.random.default_rng(0)
    v = rng.standard_normal((b, nv, TINY_FLOW.hidden_size)).astype(np.float32)
    pool = ours.query_pool.get_value()
    ours.query_pool.set_value(jnp.asarray(rng.standard_normal(pool.shape), pool.dtype))
    q = np.asarray(ours.query_pool.get_value())[:n]
    embeds = np.concatenate([v, np.broadcast_to(q, (b, n, q.shape[1]))], axis=1)
    # The mask written out by hand, independently of `hybrid_mask`.
    t = nv + n
    allow = np.zeros((t, t), bool)
    allow[:nv, :nv] = True  # visual <-> visual, bidirectional
    allow[nv:, :nv] = True  # queries see every visual token
    allow[nv:, nv:] = np.tril(np.ones((n, n), bool))  # queries see queries 0..i
    additive = torch.where(torch.from_numpy(allow), 0.0, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        want = ref(inputs_embeds=torch.from_numpy(embeds), attention_mask=additive.expand(b, 1, t, t),
                   position_ids=torch.arange(t)[None].expand(b, t)).last_hidden_state.numpy()
    assert np.array_equal(np.asarray(hybrid_mask(jnp.ones((1, nv), bool), jnp.ones((1, n), bool)))[0], allow)
    got = _hidden(ours, jnp.asarray(v), n)
    np.testing.assert_allclose(got[:, nv:], want[:, nv:], atol=TOL, rtol=0)  # H, the flow's output
    np.testing.assert_allclose(got[:, :nv], want[:, :nv], atol=TOL, rtol=0)


def test_encoder_matches_deepseek_ocr2_vision_model():
    """DeepSeek-OCR-2 always feeds its whole 144-row query table (for <= 144 visual tokens); by the
    causal mask its first N outputs must equal ours with the pool truncated to N = N_v."""
    from transformers.models.deepseek_ocr2 import configuration_deepseek_ocr2 as C
    from transformers.models.deepseek_ocr2 import modeling_deepseek_ocr2 as M

    vc = C.DeepseekOcr2VisionConfig(
        sam_config=hf_sam_config().to_dict(),
        encoder_config=C.DeepseekOcr2VisionEncoderConfig(**hf_flow_kwargs()).to_dict(),
    )
    vc._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = M.DeepseekOcr2VisionModel(vc).eval()
    randomize_(ref, 3)
    cfg = EncoderConfig(TINY_VISION, dataclasses.replace(TINY_FLOW, num_queries=144))
    ours = numpy_build(lambda: Encoder(cfg, rngs=nnx.Rngs(0)))  # every value is overwritten
    load_hf_vision_state_dict(ours, ref.state_dict())  # picks query_768_resolution (144 rows)
    # A rendered CoT and noise, 128 px -> 4 tokens. Other sizes: test_vision.py (SAM side) and
    # test_encoder_on_rendered_images.
    image, n = render_cot(SHORT_COT, font_size=17)
    assert image.size == (128, 128) and n == 4
    noise = np.random.default_rng(0).uniform(-1, 1, (128, 128, 3))
    x = np.stack([np.asarray(normalize_images(np.asarray(image)[None]))[0], noise]).astype(np.float32)
    with torch.no_grad():
        want = ref(torch.from_numpy(x).permute(0, 3, 1, 2)).last_hidden_state.numpy()
    got = np.asarray(_encode(ours, jnp.asarray(x)))
    assert want.shape == (2, 144, TINY_FLOW.hidden_size) and got.shape == (2, n, TINY_FLOW.hidden_size)
    np.testing.assert_allclose(got, want[:, :n], atol=TOL, rtol=0)


def test_every_query_count_runs():
    cfg = dataclasses.replace(TINY_FLOW, num_layers=1)
    f = numpy_build(lambda: CausalFlow(cfg, rngs=nnx.Rngs(0)))
    v = _normal(0, (2, 4, cfg.hidden_size))
    for n in (1, 4, 9, 16, 144, 256):
        out = _run(f, v, n)
        assert out.shape == (2, n, cfg.hidden_size) and np.isfinite(out).all(), n
    with pytest.raises(ValueError, match=r"n_queries=257 must be in 1\.\.256"):
        f(v, 257)
    with pytest.raises(ValueError, match="hidden_size=32"):
        f(jnp.zeros((1, 4, 16)))


def test_mask_dependency_structure(flow):
    nv, n = 5, 6
    v = _normal(1, (1, nv, TINY_FLOW.hidden_size))
    base = _hidden(flow, v, n)
    pool = flow.query_pool.get_value()
    try:
        j = 3  # change query j: outputs i < j keep still, i >= j move; visual outputs keep still
        flow.query_pool.set_value(pool.at[j].add(1.0))
        moved = _hidden(flow, v, n)
        diff = np.abs(moved - base).max(axis=-1)[0]
        assert diff[: nv + j].max() == 0.0
        assert (diff[nv + j:] > 1e-3).all()
        flow.query_pool.set_value(pool.at[: n].add(1.0))  # every query changed: visual side unmoved
        assert np.array_equal(_hidden(flow, v, n)[:, :nv], base[:, :nv])
    finally:
        flow.query_pool.set_value(pool)
    # Changing one visual token moves every output, visual and query.
    moved = _hidden(flow, v.at[0, 2].add(1.0), n)
    assert (np.abs(moved - base).max(axis=-1) > 1e-3).all()


def test_padded_batch_matches_unpadded_rows(flow):
    d = TINY_FLOW.hidden_size
    short, long = _normal(2, (1, 4, d)), _normal(3, (1, 9, d))
    batch = jnp.concatenate([jnp.pad(short, ((0, 0), (0, 5), (0, 0)), constant_values=7.0), long])
    vv = jnp.arange(9)[None] < jnp.array([[4], [9]])
    out = _run(flow, batch, 9, visual_valid=vv, query_valid=vv)
    np.testing.assert_allclose(out[:1, :4], _run(flow, short, 4), atol=1e-5, rtol=0)
    # Same shapes as the padded call (one compilation), nothing padded.
    full = jnp.ones_like(vv)
    np.testing.assert_allclose(out[1:], _run(flow, jnp.concatenate([long, long]), 9, visual_valid=full,
                                             query_valid=full)[:1], atol=1e-5, rtol=0)


def test_encoder_on_rendered_images():
    """192 px -> 9 tokens with the default tiny encoder (128 px -> 4: the parity test above)."""
    side, n = 192, 9
    image, n_tokens = render_cot(LONG_COT, font_size=17)
    assert image.size == (side, side) and n_tokens == n
    px = normalize_images(np.stack([np.asarray(image)] * 2))
    # The real initialiser (rbg keys: threefry costs far more compilation on CPU).
    enc = Encoder(TINY_ENCODER, rngs=nnx.Rngs(params=jax.random.key(0, impl="rbg")))
    h = np.asarray(_encode(enc, px))
    assert h.shape == (2, n, TINY_FLOW.hidden_size) and np.isfinite(h).all()
    assert np.abs(h[:, :1] - h[:, 1:]).max() > 1e-3  # queries differ from each other


def test_encoder_config_checks_widths():
    with pytest.raises(ConfigError, match="must equal flow.hidden_size"):
        EncoderConfig(TINY_VISION, dataclasses.replace(TINY_FLOW, hidden_size=64, head_dim=16))


def test_visual_skip_adds_the_compressor_tokens_to_the_queries():
    """flow.visual_skip (tiny from-scratch configs): H = flow(V) + V, with the same weights; off (the
    default, DeepEncoder V2) the output is the flow's query side alone."""
    image, _ = render_cot(LONG_COT, font_size=17)
    px = normalize_images(np.stack([np.asarray(image)]))
    plain = Encoder(TINY_ENCODER, rngs=nnx.Rngs(params=jax.random.key(0, impl="rbg")))
    skip_cfg = EncoderConfig(TINY_VISION, dataclasses.replace(TINY_FLOW, visual_skip=True))
    skip = Encoder(skip_cfg, rngs=nnx.Rngs(params=jax.random.key(0, impl="rbg")))
    nnx.update(skip, nnx.state(plain))
    visual = np.asarray(plain.vision(px))
    np.testing.assert_allclose(np.asarray(skip(px)), np.asarray(plain(px)) + visual, rtol=1e-5, atol=1e-5)
    assert not TINY_FLOW.visual_skip and np.abs(visual).max() > 1e-2
