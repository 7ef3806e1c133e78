"""dlr_jax.models.latent_lm: text parity with the backbone, latent rows, masking, tied projectors,
stage filters and gradients, Sampler decoding, sharded creation, vocabulary growth.

Models get numpy-random parameters (shapes from `nnx.eval_shape`): every eager `jax.random` shape
costs a compile on this CPU, and the init code itself is exercised by `from_backbone` (projectors)
and by the sharded-creation test (everything).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from dlr_jax.config import ModelConfig
from dlr_jax.core.sharding import create_sharded, make_mesh, sharded_fraction, use_mesh
from dlr_jax.generate.sampler import Sampler
from dlr_jax.models.latent_lm import (
    MASKED_LOGIT,
    LatentConfig,
    LatentLM,
    build_latent_lm,
    filter_for_stage,
    grow_vocab,
)
from dlr_jax.models.transformer import Transformer
from dlr_jax.text.tokens import train_bpe

K, DC, T = 16, 8, 12
TEXTS = [f"{a} + {b} = {a + b}. so the answer is {a + b}" for a in range(40) for b in range(0, 40, 7)]


def _mcfg(vocab: int, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, **kw)


def _np_init(make, seed: int):
    """`make()` with numpy-random values: norms ~1, codebook ~N(0, 1), other weights ~N(0, 0.1)."""
    graphdef, state = nnx.split(nnx.eval_shape(make))
    rs = np.random.default_rng(seed)

    def value(path, x):
        name = jax.tree_util.keystr(path)
        scale = 1.0 if "codebook" in name else 0.1
        v = rs.normal(size=x.shape) * scale + (1.0 if "norm" in name else 0.0)
        return jnp.asarray(v, x.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(value, state))


@functools.cache
def _jitted(method: str):
    return jax.jit(lambda gd, st, *a: getattr(nnx.merge(gd, st), method)(*a), static_argnums=0)


def _run(model, method: str, *args):
    """`getattr(model, method)(*args)` under jit (eager dispatch compiles op by op: slow here)."""
    return _jitted(method)(*nnx.split(model), *args)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state)(ids, attention_mask=mask)


def _logits(model, ids, mask=None):
    """Full forward with an attention mask (ones if None) -> numpy logits."""
    mask = np.ones(np.shape(ids), np.int32) if mask is None else mask
    return np.asarray(_forward(*nnx.split(model), jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))


def _np(x) -> np.ndarray:
    return np.asarray(x, np.float64)


@pytest.fixture(scope="module")
def tok():
    return train_bpe(TEXTS, vocab_size=300, num_latents=K, pad_multiple=8)


@pytest.fixture(scope="module")
def model(tok) -> LatentLM:
    backbone = _np_init(lambda: Transformer(_mcfg(tok.text_vocab_size), rngs=nnx.Rngs(0)), 0)
    codebook = np.random.default_rng(1).normal(size=(K, DC)).astype(np.float32)
    return LatentLM.from_backbone(backbone, tok, codebook=codebook, rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def ids(tok) -> np.ndarray:
    """[4, T]: row 0 text only; rows 1..3 with latent ids at positions 3..6 (batch 4 splits over
    fsdp = 4; every test uses this one shape so compiled forwards are shared)."""
    rs = np.random.RandomState(0)
    out = rs.randint(7, tok.text_vocab_size, (4, T)).astype(np.int32)
    out[1:, 3:7] = tok.latent_offset + rs.randint(0, K, (3, 4))
    return out


def test_text_logits_equal_backbone(tok, model, ids):
    assert model.vocab_size == tok.total_vocab_size and tok.total_vocab_size % 8 == 0
    logits = _logits(model, ids)
    assert logits.shape == (4, T, tok.total_vocab_size) and logits.dtype == np.float32
    text_only = np.where(np.asarray(tok.is_latent(ids)), 7, ids)  # causal: positions < 3 unchanged
    ref = _logits(model.backbone, text_only)
    assert ref.shape == (4, T, tok.text_vocab_size)
    v = tok.text_vocab_size  # text rows equal the backbone's where no latent is in the causal past
    chex.assert_trees_all_close((logits[0, :, :v], logits[1:, :3, :v]), (ref[0], ref[1:, :3]), rtol=1e-6, atol=1e-6)
    assert np.abs(logits[1:, 3:, : tok.text_vocab_size] - ref[1:, 3:]).max() > 1e-3  # latents matter
    np.testing.assert_array_equal(model.vocab_mask(), tok.vocab_padding_mask())


def test_latent_rows_by_hand(tok, model, ids):
    emb = _np(_run(model, "embed_tokens", jnp.asarray(ids)))
    cb = _np(model.codebook[...])
    w_in, b_in = _np(model.p_in.kernel[...]), _np(model.p_in.bias[...])
    w_out, b_out = _np(model.p_out.kernel[...]), _np(model.p_out.bias[...])
    lat = np.asarray(tok.is_latent(ids))
    assert lat.sum() == 12
    k = ids[lat] - tok.latent_offset
    np.testing.assert_allclose(emb[lat], cb[k] @ w_in + b_in, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(emb[~lat], _np(model.backbone.embed[...])[ids[~lat]])

    h = _run(model, "hidden_states", jnp.asarray(ids))
    logits = _np(_logits(model, ids))  # = logits_from_hidden(h)
    lo = tok.latent_offset
    np.testing.assert_allclose(logits[..., lo : lo + K], _np(h) @ (cb @ w_out + b_out).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(model.latent_rows("out")), cb @ w_out + b_out, rtol=1e-5, atol=1e-6)


def test_padding_rows_never_predicted(tok, model, ids):
    probs = np.asarray(jax.nn.softmax(_logits(model, ids), axis=-1))
    pad = ~tok.vocab_padding_mask()
    assert pad[tok.latent_offset + K :].all() and pad.sum() > 0
    assert probs[..., pad].max() == 0.0
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert probs[..., tok.latent_offset : tok.latent_offset + K].sum(-1).min() > 0


def test_gap_rows_and_text_mask():
    # Qwen-like layout: the tokenizer knows fewer ids than the model has rows, latents start after a gap.
    vb, offset, total = 40, 48, 64
    valid = np.ones(vb, bool)
    valid[30:] = False
    cfg = LatentConfig(num_latents=8, latent_dim=DC, latent_offset=offset, total_vocab_size=total,
                       valid_text_rows=valid)
    assert cfg.valid_text_rows == ((0, 30),)
    model = _np_init(lambda: build_latent_lm(_mcfg(vb), cfg), 3)
    ids = np.asarray([[1, 2, offset + 3, 5, offset + 7]], np.int32)
    logits = _logits(model, ids)
    assert logits.shape == (1, 5, total)
    masked = np.ones(total, bool)
    masked[:30] = False
    masked[offset : offset + 8] = False
    assert (logits[..., masked] == MASKED_LOGIT).all()
    assert (logits[..., ~masked] > MASKED_LOGIT / 2).all()
    np.testing.assert_array_equal(model.vocab_mask(), ~masked)


def test_bad_layouts_raise():
    cfg = LatentConfig(num_latents=4, latent_dim=DC, latent_offset=32, total_vocab_size=40)
    make = lambda vocab, c, **kw: nnx.eval_shape(lambda: build_latent_lm(_mcfg(vocab), c, **kw))
    with pytest.raises(ValueError, match="alias pretrained rows"):
        make(40, cfg)
    with pytest.raises(ValueError, match="expected .num_latents, latent_dim."):
        make(32, cfg, codebook=np.zeros((4, DC + 1), np.float32))
    with pytest.raises(ValueError, match="total_vocab_size=35"):
        LatentConfig(num_latents=4, latent_dim=DC, latent_offset=32, total_vocab_size=35)
    # A tokenizer that produces ids past the backbone's rows (boundary tokens added to Llama's).
    all_text = LatentConfig(num_latents=4, latent_dim=DC, latent_offset=34, total_vocab_size=40,
                            valid_text_rows=np.ones(34, bool))
    with pytest.raises(ValueError, match="text id 32 .* only 32 rows"):
        make(32, all_text)
    with pytest.raises(ValueError, match="has no latent ids"):
        LatentConfig.from_tokenizer(train_bpe(TEXTS, vocab_size=270, num_latents=0), DC)


def test_tied_projectors_share_one_param(tok, model):
    tied = LatentLM.from_backbone(model.backbone, tok, latent_dim=DC, tie_projectors=True, rngs=nnx.Rngs(1))
    assert tied.p_out is tied.p_in and model.p_out is not model.p_in
    n = lambda m: len(jax.tree.leaves(nnx.state(m, filter_for_stage("align"))))
    assert (n(tied), n(model)) == (2, 4)  # kernel + bias per projector
    np.testing.assert_array_equal(tied.latent_rows("in"), tied.latent_rows("out"))
    assert tied.backbone is model.backbone  # wrapped, not copied


def test_set_codebook(model):
    old = np.asarray(model.codebook[...])
    new = old[::-1].copy()
    model.set_codebook(new)
    try:
        np.testing.assert_array_equal(model.codebook[...], new)
        with pytest.raises(ValueError, match="expected"):
            model.set_codebook(new[:, :-1])
    finally:
        model.set_codebook(old)


def test_align_filter_and_projector_gradients(tok, model, ids):
    graphdef, train, frozen = nnx.split(model, filter_for_stage("align"), ...)
    paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(train)}
    assert paths == {"p_in/kernel", "p_in/bias", "p_out/kernel", "p_out/bias"}

    def loss(tr, ids):
        logits = nnx.merge(graphdef, tr, frozen)(ids[:, :-1])
        lp = jax.nn.log_softmax(logits, -1)
        return -jnp.mean(jnp.take_along_axis(lp, ids[:, 1:, None], -1))

    grad = jax.jit(jax.grad(loss))
    for p, g in nnx.to_flat_state(grad(train, jnp.asarray(ids))):
        assert np.abs(np.asarray(g.get_value())).max() > 0, p
    # Without latent ids in inputs or targets P_in gets no gradient (P_out still does: the latent
    # rows are in the softmax normaliser).
    g_text = grad(train, jnp.asarray(ids[[0, 0, 0, 0]]))
    assert np.abs(np.asarray(g_text["p_in"]["kernel"].get_value())).max() == 0
    assert np.abs(np.asarray(g_text["p_out"]["kernel"].get_value())).max() > 0


def test_stage_filters():
    frozen_cb = LatentConfig(num_latents=4, latent_dim=DC, latent_offset=32, total_vocab_size=40,
                             codebook_trainable=False)
    m = nnx.eval_shape(lambda: build_latent_lm(_mcfg(32), frozen_cb))

    def tops(stage, c=None):
        return {p[0] for p, _ in nnx.to_flat_state(nnx.state(m, filter_for_stage(stage, c)))}

    assert tops("align") == {"p_in", "p_out"}
    assert tops("sft") == {"backbone", "codebook", "p_in", "p_out"}
    assert tops("sft", frozen_cb) == {"backbone", "p_in", "p_out"}
    assert tops("rl") == {"backbone", "p_in", "p_out"}
    assert tops("textsft") == {"backbone"}
    with pytest.raises(ValueError, match="unknown stage 'ocr'"):
        filter_for_stage("ocr")


def test_sampler_cached_decoding_matches_full_forward(tok, model, ids):
    n_new = 6
    prompts = [ids[1, :6].tolist(), [1, tok.latent_offset + 2, 9, 11]]  # both contain latent ids
    out = Sampler(model, prompt_bucket=8).generate(prompts, max_new_tokens=n_new)
    assert out.tokens.shape == (2, n_new) and (out.lengths == n_new).all()
    seqs = np.zeros((4, T), np.int32)  # right-padded [prompt ; generated] (rows 2, 3 unused)
    mask = np.zeros_like(seqs)
    for i, p in enumerate(prompts):
        seqs[i, : len(p) + n_new], mask[i, : len(p) + n_new] = p + out.tokens[i].tolist(), 1
    logp = np.asarray(jax.nn.log_softmax(_logits(model, seqs, mask), -1))
    for i, p in enumerate(prompts):
        steps = logp[i, len(p) - 1 : len(p) - 1 + n_new]
        np.testing.assert_array_equal(steps.argmax(-1), out.tokens[i])
        chosen = steps[np.arange(n_new), out.tokens[i]]
        np.testing.assert_allclose(out.logprobs[i], chosen, rtol=1e-4, atol=1e-4)
    assert np.asarray(tok.is_latent(out.tokens)).any()  # decode steps fed latent ids back in


def test_sharded_creation_matches_single_device(tok, ids):
    if len(jax.devices()) < 8:
        pytest.skip(f"needs 8 (fake) devices, have {len(jax.devices())}")
    mesh = make_mesh(1, 4, 2)
    cfg = LatentConfig.from_tokenizer(tok, DC)
    # An "rbg" key: threefry init compiles far slower on a CPU and is not what is tested here.
    make = lambda: build_latent_lm(_mcfg(tok.text_vocab_size), cfg,
                                   rngs=nnx.Rngs(params=jax.random.key(7, impl="rbg")))
    sharded = create_sharded(make, mesh)
    assert sharded.codebook[...].sharding.spec[0] == "tensor"  # K = 16 split over tensor = 2
    assert sharded.p_in.kernel[...].sharding.spec == PartitionSpec(None, "fsdp")
    assert sharded_fraction(nnx.state(sharded, nnx.Param)) > 0.5
    graphdef, state = nnx.split(sharded)
    single = nnx.merge(graphdef, jax.device_get(state))  # same values, host arrays
    with use_mesh(mesh):
        logits = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))(state, jnp.asarray(ids))
    assert len(logits.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(logits), _logits(single, ids), rtol=1e-5, atol=1e-5)
    # Wrapping an already-sharded backbone places the new rows on the backbone's mesh.
    wrapped = LatentLM.from_backbone(sharded.backbone, cfg, rngs=nnx.Rngs(0))
    assert wrapped.codebook[...].sharding.mesh == mesh
    assert wrapped.codebook[...].sharding.spec[0] == "tensor"


def test_grow_vocab_keeps_old_rows():
    backbone = _np_init(lambda: Transformer(_mcfg(30), rngs=nnx.Rngs(2)), 2)
    emb0, head0 = np.asarray(backbone.embed[...]), np.asarray(backbone.lm_head[...])
    grow_vocab(backbone, 34)
    emb, head = np.asarray(backbone.embed[...]), np.asarray(backbone.lm_head[...])
    assert backbone.cfg.vocab_size == 34 and emb.shape == (34, 32) and head.shape == (32, 34)
    np.testing.assert_array_equal(emb[:30], emb0)
    np.testing.assert_array_equal(head[:, :30], head0)
    np.testing.assert_allclose(emb[30:], np.broadcast_to(emb0.mean(0), (4, 32)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(head[:, 30:], np.broadcast_to(head0.mean(1, keepdims=True), (32, 4)),
                               rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="cannot shrink"):
        grow_vocab(backbone, 20)


def test_entry_points_check_ids_at_trace_time(model, ids):
    spec = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    with pytest.raises(AssertionError, match="assert_type"):  # float "ids" would be cast silently
        jax.eval_shape(model, spec(ids.shape, jnp.float32))
    with pytest.raises(AssertionError, match="assert_equal_shape"):  # a mask for other positions
        jax.eval_shape(lambda i, m: model(i, attention_mask=m), spec(ids.shape), spec((4, T + 1)))
    with pytest.raises(AssertionError, match="assert_rank"):
        jax.eval_shape(model, spec((T,)))
    cache = jax.eval_shape(lambda: model.init_cache(4, 16))
    with pytest.raises(AssertionError, match="assert_equal_shape"):
        jax.eval_shape(lambda i, p, m, c: model.forward_cached(i, p, m, c), spec((4, 1)), spec((4, 2)),
                       spec((4, 1), jnp.bool_), cache)
