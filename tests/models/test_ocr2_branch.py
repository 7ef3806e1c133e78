"""D_ocr on a DeepSeek-OCR-2 codebook (models/ocr2_branch.py): sft's branch starts as the codebook stage's
decoder (the learned map from the LM's width is solved exactly at init) and reads left-padded codes like
unpadded ones; its stop-gradient leaves the LM's gradients exactly those of the LM's own loss; the decoder it
saves, decoded with the KV cache, reads codes as the training layout does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.convert.ocr2 import load_ocr2
from dlr_jax.models.dual_branch import DualBranchLM
from dlr_jax.models.latent_lm import LatentConfig, build_latent_lm
from dlr_jax.models.ocr2_branch import Ocr2CodeDecoder, exact_map_init, ocr2_branch_from_codebook_model
from dlr_jax.models.ocr2_codebook import PAD, Ocr2CodebookConfig, Ocr2CodebookModel
from dlr_jax.stages.codebook.models import Ocr2LatentDecoder
from tests.hf_fixtures import save_tiny_ocr2, tiny_char_tokenizer

K = 16
# d_model 48 > d_c + 1 = 33: the map's start is exact
LM = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                 head_dim=16)
CODES = [[3, 1, 4, 1], [5, 9], [2, 6, 5, 3]]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ocr2")
    save_tiny_ocr2(d, seed=0, small=True)
    ocfg, ocr2 = load_ocr2(d)
    cbm = Ocr2CodebookModel(Ocr2CodebookConfig(ocfg, K, max_text_len=10, prompt_ids=(5, 6)), rngs=nnx.Rngs(0))
    cbm.ocr2 = ocr2
    lm = build_latent_lm(LM, LatentConfig(num_latents=K, latent_dim=ocfg.d_c, latent_offset=64, total_vocab_size=96),
                         codebook=cbm.vq.codebook[...], rngs=nnx.Rngs(params=jax.random.key(1, impl="rbg")))
    return cbm, lm, DualBranchLM(lm, ocr2_branch_from_codebook_model(cbm, lm))


def _batch():
    n = max(map(len, CODES))
    codes, mask = np.zeros((len(CODES), n), np.int32), np.zeros((len(CODES), n), bool)
    for i, z in enumerate(CODES):  # left-padded
        codes[i, n - len(z):], mask[i, n - len(z):] = z, True
    targets = np.random.default_rng(0).integers(4, 100, (len(CODES), 7)).astype(np.int32)
    targets[1, 4:] = PAD  # a shorter target, right-padded
    return jnp.asarray(codes), jnp.asarray(mask), jnp.asarray(targets)


def test_branch_starts_as_the_codebook_decoder_and_padding_is_invisible(parts):
    cbm, lm, dual = parts
    codes, mask, targets = _batch()
    got = np.asarray(nnx.jit(lambda m, c, t, k: m.ocr.decoder_logits(m.latent_features(c), t, k)[0])(
        dual, codes, targets, mask))
    ref_logits = nnx.jit(lambda m, f, t: m.decoder_logits(f, t)[0])
    for rows in ([0, 2], [1]):  # unpadded, through the codebook stage's own layout (rows of one length together)
        feats = cbm.vq.codebook[...][jnp.asarray([CODES[i] for i in rows])]
        ref = np.asarray(ref_logits(cbm, feats, targets[jnp.asarray(rows)]))
        for r, i in enumerate(rows):
            real = np.asarray(targets[i]) != PAD
            np.testing.assert_allclose(got[i][real], ref[r][real], atol=2e-4, rtol=2e-4)
    # the map's start is the exact solve: E_lat(c) M = c for arbitrary c, not only codebook rows
    c = jax.random.normal(jax.random.key(3), (5, cbm.cfg.code_dim))
    np.testing.assert_allclose(lm.p_in(c) @ exact_map_init(lm, cbm.cfg.code_dim), c, atol=1e-4)
    assert dual.ocr.prefix_map[...].shape == (LM.hidden_size, cbm.cfg.code_dim)


def _grads(dual, fn):
    graphdef, params, rest = nnx.split(dual, nnx.Param, ...)
    grads = jax.jit(jax.grad(lambda p: fn(nnx.merge(graphdef, p, rest))))(params)
    return {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(grads)}


def test_stop_gradient_leaves_the_lm_the_gradients_of_its_own_loss(parts):
    _, _, dual = parts
    codes, mask, targets = _batch()
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 96, (3, 9)), jnp.int32)
    r_lm = jax.random.normal(jax.random.key(0), (3, 9, 96))
    r_ocr = jax.random.normal(jax.random.key(1), (3, 7, dual.ocr.text.cfg.base.vocab_size))

    def lm_loss(m):
        return jnp.sum(m.lm(tokens) * r_lm)

    def ocr_loss(m, sg=True):
        feats = m.latent_features(codes) if sg else m.lm.embed_latents(codes)
        return jnp.sum(m.ocr.decoder_logits(feats, targets, mask)[0] * r_ocr)

    ocr_only = _grads(dual, ocr_loss)
    lm_keys = [k for k in ocr_only if k.startswith("lm/")]
    assert {"lm/codebook", "lm/p_in/kernel", "lm/p_in/bias"} <= set(lm_keys)
    assert any(k.startswith("lm/backbone/") for k in lm_keys)
    for k in lm_keys:
        assert not np.any(ocr_only[k]), k  # exactly zero on every LM tensor: the OCR loss adds nothing there
    # so the summed loss gives the LM the gradient of its own loss (one program vs another: float rounding only)
    both, alone = _grads(dual, lambda m: lm_loss(m) + ocr_loss(m)), _grads(dual, lm_loss)
    for k in lm_keys:
        np.testing.assert_allclose(both[k], alone[k], rtol=1e-5, atol=1e-5, err_msg=k)
    assert np.any(both["ocr/prefix_map"]) and np.any(both["ocr/projector"]) and np.any(both["ocr/view_separator"])
    assert any(np.any(v) for k, v in both.items() if k.startswith("ocr/text/moe/"))
    # the same objective without the stop-gradient reaches the LM's latent rows: the check above can fail
    leak = _grads(dual, lambda m: ocr_loss(m, sg=False))
    assert np.any(leak["lm/p_in/kernel"]) and np.any(leak["lm/codebook"])


def test_saved_decoder_reads_codes_with_the_kv_cache_as_training_lays_them_out(parts):
    cbm, lm, dual = parts
    dec = dual.decoder_for_decoding()
    assert isinstance(dec, Ocr2CodeDecoder) and dec.text is dual.ocr.text  # shared, not copied
    start = Ocr2CodeDecoder.from_codebook_model(cbm)
    np.testing.assert_allclose(dec.code_rows[...], start.code_rows[...], atol=2e-4)  # the exact start
    tok = tiny_char_tokenizer()
    codes = [*CODES, [7], []]
    reader = Ocr2LatentDecoder(start, tok, batch_size=4)
    texts = reader.decode(codes)
    assert texts[-1] == "" and len(texts) == len(codes)
    assert Ocr2LatentDecoder(dec, tok, batch_size=4).decode(codes) == texts
    # greedy over the cache = the teacher-forced argmax of the codebook stage's layout on its own output
    res = reader.sampler.generate([reader.prompt(z) for z in CODES], max_new_tokens=cbm.cfg.max_text_len,
                                  stop_ids=[cbm.cfg.eos_id], pad_id=cbm.cfg.eos_id)
    for i, z in enumerate(CODES):
        out = res.tokens[i, : res.lengths[i]]
        logits, _ = nnx.jit(lambda m, f, t: m.decoder_logits(f, t))(cbm, cbm.vq.codebook[...][jnp.asarray([z])],
                                                                    jnp.asarray(out[None]))
        np.testing.assert_array_equal(np.argmax(np.asarray(logits)[0], -1), out)
    with pytest.raises(ValueError, match="outside"):
        reader.decode([[K]])
