"""DeepSeek-OCR-2: logit parity with transformers' DeepseekOcr2ForConditionalGeneration (text only
and image-conditioned; MoE layers with a non-trivial router), import from a save_pretrained
checkpoint, export that transformers loads back with equal logits."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from dlr_jax.convert.ocr2 import load_ocr2, save_ocr2_hf
from dlr_jax.models.ocr2 import SMALL_TABLE
from tests.hf_fixtures import build_tiny_ocr2

TOL = 1e-4
IMAGE_TOKEN = 150


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    ref = build_tiny_ocr2(seed=0)
    d = tmp_path_factory.mktemp("ocr2")
    ref.save_pretrained(d)
    cfg, ours = load_ocr2(d)
    return ref, cfg, ours, d


_call = nnx.jit(lambda m, ids, px: m(ids, px))
_text = nnx.jit(lambda m, ids: m(ids))


def _ids(b: int, t: int, seed: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, 150, (b, t))  # no image token
    return ids


def _image_prompt(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two rows: 3 text tokens, SMALL_TABLE + 1 image tokens, 5 text tokens; two 128 px images."""
    rng = np.random.default_rng(seed)
    n_img = SMALL_TABLE + 1
    ids = rng.integers(0, 150, (2, 3 + n_img + 5))
    ids[:, 3:3 + n_img] = IMAGE_TOKEN
    px = rng.uniform(-1, 1, (2, 3, 128, 128)).astype(np.float32)
    return ids, px


def test_text_logits_match_transformers(pair):
    ref, cfg, ours, _ = pair
    ids = _ids(2, 17, 0)
    with torch.no_grad():
        out = ref(input_ids=torch.tensor(ids), output_router_logits=True)
    want = out.logits.numpy()
    # The router is far from uniform: the top expert takes > 1.5x the uniform share on average.
    probs = torch.softmax(out.router_logits[0].float(), -1).numpy()
    assert probs.max(-1).mean() > 1.5 / cfg.text.moe.num_experts
    got = np.asarray(_text(ours, jnp.asarray(ids)))
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


@pytest.mark.slow
def test_image_conditioned_logits_match_transformers(pair):
    ref, _, ours, _ = pair
    ids, px = _image_prompt(1)
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids), pixel_values=torch.from_numpy(px)).logits.numpy()
        blank = ref(input_ids=torch.tensor(ids)).logits.numpy()
    assert np.abs(want - blank).max() > 1e-2  # the image changes the logits
    got = np.asarray(_call(ours, jnp.asarray(ids), jnp.asarray(px)))
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_export_loads_in_transformers_with_equal_logits(pair, tmp_path):
    import transformers as tf

    ref, _, ours, _ = pair
    save_ocr2_hf(ours, tmp_path)
    back = tf.DeepseekOcr2ForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids, px = _image_prompt(2)
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids), pixel_values=torch.from_numpy(px)).logits.numpy()
        got = back(input_ids=torch.tensor(ids), pixel_values=torch.from_numpy(px)).logits.numpy()
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    for name, t in ref.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[name].numpy(), t.numpy(), err_msg=name)


def test_import_onto_8_devices_shards_experts_and_matches_one_device(pair):
    import jax

    from dlr_jax.core.sharding import make_mesh, use_mesh

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
    _, _, one, d = pair
    mesh = make_mesh(1, 8, 1)
    _, many = load_ocr2(d, mesh=mesh)
    gate = many.text.moe.expert_gate[...]
    assert gate.sharding.spec[1] == "fsdp" and gate.addressable_shards[0].data.shape[1] == 1  # 8 experts / 8
    ids = _ids(8, 9, 3)
    want = np.asarray(_text(one, jnp.asarray(ids)))
    with use_mesh(mesh):
        got = np.asarray(_text(many, jnp.asarray(ids)))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@nnx.jit
def _enc_emb(m, imgs):
    feats = m.encode(imgs)
    return feats, m.image_embeddings(feats)


@pytest.mark.slow
def test_codebook_quantize_points(pair):
    """quantize_at=flow: the VQ input is H (d_c) and the decoder's image embeddings of H are the
    parity-tested ones; quantize_at=projector: the VQ input is the projector output (D wide)."""
    from dlr_jax.models.ocr2_codebook import Ocr2CodebookConfig, Ocr2CodebookModel

    _, cfg, ours, _ = pair
    images = np.random.default_rng(4).integers(0, 256, (2, 128, 128), dtype=np.uint8)
    x = jnp.repeat(jnp.asarray(images)[..., None], 3, -1).astype(jnp.float32) / 127.5 - 1.0  # normalize_images
    nv = 4
    full = np.asarray(nnx.jit(lambda m, x: m.image_embeddings(x))(ours, x))  # [2, 144 + 1, D]
    for at, width in (("flow", cfg.d_c), ("projector", cfg.text.base.hidden_size)):
        cb = Ocr2CodebookModel(Ocr2CodebookConfig(cfg, 16, quantize_at=at), rngs=nnx.Rngs(0))
        cb.ocr2 = ours
        feats, emb = _enc_emb(cb, jnp.asarray(images))
        assert feats.shape == (2, nv, width) and cb.vq.codebook[...].shape == (16, width)
        # The first nv query outputs equal the full-table run (causal queries), then the separator.
        np.testing.assert_allclose(np.asarray(emb)[:, :nv], full[:, :nv], atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(emb)[:, nv], full[:, -1], atol=TOL, rtol=0)
