"""The sft dual branch's model: the OCR branch starts as the codebook stage's decoder, reads
left-padded prefixes like unpadded ones, and its stop-gradient keeps every LM gradient at zero."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig, load_config
from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model, teacher_inputs
from dlr_jax.models.dual_branch import DualBranchLM, OCRBranch, branch_from_codebook_model, exact_prefix_init
from dlr_jax.models.latent_lm import LatentConfig, build_latent_lm
from dlr_jax.stages.codebook.models import LatentDecoder
from dlr_jax.text.ocr_text import encode_target
from tests.micro import codebook_nets

K, DC = 16, 16
CODEBOOK = [
    "codebook.max_side=128", "codebook.image_size=128", "codebook.max_text_len=24",
    *codebook_nets(num_queries=4),
    f"latent.num_latents={K}",
    f"latent.latent_dim={DC}",
]
LM = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                 head_dim=16)
CODES = [[3, 1, 4, 1], [5, 9], [2, 6, 5, 3]]
TEXTS = ["x=1+2", "3*4=12\nso 12", "ab"]


@pytest.fixture(scope="module")
def parts():
    cbm = build_codebook_model(CodebookModelConfig.from_config(load_config(None, CODEBOOK)), seed=0)
    lm = build_latent_lm(LM, LatentConfig(num_latents=K, latent_dim=DC, latent_offset=64, total_vocab_size=96),
                         codebook=cbm.vq.codebook[...], rngs=nnx.Rngs(params=jax.random.key(1, impl="rbg")))
    return cbm, lm, DualBranchLM(lm, branch_from_codebook_model(cbm, lm))


def _batch(max_text_len=24):
    n = max(map(len, CODES))
    codes = np.zeros((len(CODES), n), np.int32)
    mask = np.zeros((len(CODES), n), bool)
    for i, z in enumerate(CODES):  # left-padded
        codes[i, n - len(z):], mask[i, n - len(z):] = z, True
    targets = jnp.asarray(np.stack([encode_target(t, max_text_len)[0] for t in TEXTS]))
    inputs, in_mask = teacher_inputs(targets)
    return jnp.asarray(codes), jnp.asarray(mask), inputs, in_mask


def test_branch_starts_as_the_codebook_decoder_and_padding_is_invisible(parts):
    cbm, lm, dual = parts
    codes, mask, inputs, in_mask = _batch()
    got = np.asarray(nnx.jit(DualBranchLM.ocr_logits)(dual, codes, mask, inputs, in_mask))
    ref_logits = nnx.jit(type(cbm).decoder_logits)
    # the rows unpadded, through the codebook stage's own prefix path (rows of one length together)
    for rows in ([0, 2], [1]):
        feats = cbm.vq.codebook[...][jnp.asarray([CODES[i] for i in rows])]
        ref = np.asarray(ref_logits(cbm, feats, inputs[jnp.asarray(rows)], in_mask[jnp.asarray(rows)]))
        for r, i in enumerate(rows):
            real = np.asarray(in_mask[i])  # padded text positions attend to nothing and are never targets
            np.testing.assert_allclose(got[i][real], ref[r][real], atol=2e-4, rtol=2e-4)
    # the init is the exact solve: P_in(c) W = c P for arbitrary c, not only codebook rows
    c = jax.random.normal(jax.random.key(3), (5, DC))
    w = exact_prefix_init(lm, cbm.prefix_proj[...])
    np.testing.assert_allclose(lm.p_in(c) @ w, c @ cbm.prefix_proj[...], atol=1e-4)


def _grads(dual, fn):
    graphdef, params, rest = nnx.split(dual, nnx.Param, ...)
    grads = jax.jit(jax.grad(lambda p: fn(nnx.merge(graphdef, p, rest))))(params)
    return {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(grads)}


def test_stop_gradient_isolates_the_lm(parts):
    _, _, dual = parts
    codes, mask, inputs, in_mask = _batch()
    r = jax.random.normal(jax.random.key(0), (len(CODES), inputs.shape[1], dual.ocr.cfg.decoder.vocab_size))
    grads = _grads(dual, lambda m: jnp.sum(m.ocr_logits(codes, mask, inputs, in_mask) * r))
    lm_keys = [k for k in grads if k.startswith("lm/")]
    assert {"lm/codebook", "lm/p_in/kernel", "lm/p_in/bias"} <= set(lm_keys)
    assert any(k.startswith("lm/backbone/") for k in lm_keys)
    for k in lm_keys:
        assert not np.any(grads[k]), k  # exactly zero, every LM tensor
    assert np.any(grads["ocr/prefix_proj"]) and any(np.any(v) for k, v in grads.items() if k.startswith("ocr/decoder"))
    # the same objective without the stop-gradient reaches the LM's latent rows: the check above can fail
    leak = _grads(dual, lambda m: jnp.sum(m.ocr.decoder_logits(m.lm.embed_latents(codes), inputs, in_mask, mask) * r))
    assert np.any(leak["lm/p_in/kernel"]) and np.any(leak["lm/codebook"])


def test_decoding_module_reads_code_ids_like_the_codebook_model(parts):
    cbm, lm, dual = parts
    dec = dual.decoder_for_decoding()
    np.testing.assert_allclose(dec.vq.codebook[...], lm.p_in(lm.codebook[...]), atol=1e-5)
    assert dec.decoder is dual.ocr.decoder  # shared, not copied
    codes = [*CODES, [7], []]
    ours = LatentDecoder(dec, batch_size=4).decode(codes, limits=[12] * len(codes))
    theirs = LatentDecoder(cbm, batch_size=4).decode(codes, limits=[12] * len(codes))
    assert ours == theirs and ours[-1] == "" and any(ours)


def test_width_mismatch_is_an_error(parts):
    cbm, lm, _ = parts
    with pytest.raises(ValueError, match="reads width 8"):
        DualBranchLM(lm, OCRBranch(cbm.cfg, 8, rngs=nnx.Rngs(0), decoder=cbm.decoder))
    with pytest.raises(ValueError, match="code_rows have width 4"):
        OCRBranch(cbm.cfg, 8, rngs=nnx.Rngs(0), decoder=cbm.decoder, code_rows=np.zeros((K, 4)))
