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


# ---- KV-cached decoding (models/ocr2_reader.py driven by generate.sampler.Sampler) ---------------------------

GEN = 12  # greedy tokens compared


def _hf_greedy(ref, ids: list[int], px: np.ndarray | None = None) -> list[int]:
    """transformers' generate, one row at a time (no padding), greedy, never stopping early."""
    image = {} if px is None else {"pixel_values": torch.from_numpy(px)}
    with torch.no_grad():
        out = ref.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=GEN, do_sample=False, eos_token_id=None, **image)
    return out[0, len(ids):].tolist()


def _text_prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(3, IMAGE_TOKEN, n).tolist() for n in (5, 9)]


def _reader(ours, rows=None, mesh=None):
    import jax

    from dlr_jax.models.ocr2_reader import Ocr2Reader

    rows = jnp.zeros((1, ours.cfg.text.base.hidden_size)) if rows is None else rows
    if mesh is not None:  # beside the sharded decoder: replicated over its mesh
        rows = jax.device_put(rows, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return Ocr2Reader(ours.text, rows)


def test_kv_cached_greedy_matches_transformers_generate(pair):
    """Text only: two prompts of different lengths in one batch (left-padded by the Sampler) decode the
    tokens transformers' generate gives each alone."""
    from dlr_jax.generate.sampler import Sampler

    ref, _, ours, _ = pair
    prompts = _text_prompts()
    want = [_hf_greedy(ref, p) for p in prompts]
    got = Sampler(_reader(ours), prompt_bucket=8).generate(prompts, max_new_tokens=GEN)
    assert got.tokens.tolist() == want and len(set(map(tuple, want))) == 2


@pytest.mark.slow
def test_kv_cached_greedy_with_vision_tokens_matches_transformers_generate(pair):
    """The image embeddings (projected flow outputs + view separator) as rows the prompt names where the
    image tokens were; in a batch with a text-only prompt of another length."""
    from dlr_jax.generate.sampler import Sampler

    ref, cfg, ours, _ = pair
    ids, px = _image_prompt(3)
    ids, px = ids[:1].tolist()[0], px[:1]
    want = [_hf_greedy(ref, ids, px), _hf_greedy(ref, _text_prompts()[0])]
    rows = nnx.jit(lambda m, x: m.image_embeddings(x))(ours, jnp.asarray(px.transpose(0, 2, 3, 1)))[0]
    v = cfg.text.base.vocab_size
    named = [t for t in ids]
    where = [i for i, t in enumerate(ids) if t == IMAGE_TOKEN]
    for j, i in enumerate(where):
        named[i] = v + j
    assert len(where) == rows.shape[0] == SMALL_TABLE + 1
    got = Sampler(_reader(ours, rows), prompt_bucket=8).generate([named, _text_prompts()[0]], max_new_tokens=GEN)
    assert got.tokens.tolist() == want
    assert want[0] != _hf_greedy(ref, [IMAGE_TOKEN if t == IMAGE_TOKEN else t for t in ids])  # the image matters


def test_kv_cached_decoding_sharded_over_8_devices_equals_one_device(pair):
    """Experts and weights split over fsdp=8, the batch over the mesh: the same greedy tokens."""
    import jax

    from dlr_jax.core.sharding import make_mesh
    from dlr_jax.generate.sampler import Sampler

    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
    ref, _, ours, d = pair
    mesh = make_mesh(1, 8, 1)
    _, many = load_ocr2(d, mesh=mesh)
    prompts = _text_prompts() * 4  # 8 rows: one a device
    want = Sampler(_reader(ours), prompt_bucket=8).generate(prompts, max_new_tokens=GEN).tokens
    sampler = Sampler(_reader(many, mesh=mesh), mesh=mesh, prompt_bucket=8)
    got = sampler.generate(prompts, max_new_tokens=GEN).tokens
    np.testing.assert_array_equal(got, want)
    assert many.text.moe.expert_gate[...].sharding.spec[1] == "fsdp"
