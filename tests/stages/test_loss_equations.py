"""Each stage loss against the paper's equation written out in numpy float64, under both reductions
(`TrainConfig.loss_reduction`): sum = the paper's sums per example, averaged over the batch's examples; mean =
per token (per character; the VQ terms per element). The models are small stand-ins whose logits the reference
recomputes from the same numbers, so only the losses' own arithmetic is under test."""

from __future__ import annotations

import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.models.ocr2_codebook import PAD as OCR2_PAD
from dlr_jax.models.vq import quantize
from dlr_jax.stages import common, sft
from dlr_jax.stages.codebook import ocr2 as codebook_ocr2
from dlr_jax.stages.codebook import stage as codebook
from dlr_jax.text.ocr_text import VOCAB

ROOT = Path(__file__).resolve().parents[2]
RTOL = 1e-5
LAMBDA, BETA = 0.25, 0.1
RS = np.random.RandomState(0)
B, N, D, K, T, V = 3, 4, 5, 7, 9, 11  # images, latents per image, d_c, codes, target length, decoder vocab
H = RS.normal(size=(B, N, D)).astype(np.float32)  # encoder features
CODEBOOK = RS.normal(size=(K, D)).astype(np.float32)
W_DEC = RS.normal(size=(D, V)).astype(np.float32)  # decoder logits: mean of its inputs' features @ W + P[t]
P_DEC = RS.normal(size=(T, V)).astype(np.float32)
LENGTHS = (9, 5, 2)  # target characters per image (<eos> included), <pad> after


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _targets(pad: int, low: int) -> np.ndarray:
    t = np.full((B, T), pad, np.int32)
    for b, n in enumerate(LENGTHS):
        t[b, :n] = RS.randint(low, V, n)
    return t


CHAR_TARGETS = _targets(VOCAB.PAD, VOCAB.NUM_SPECIAL)
TOKEN_TARGETS = _targets(OCR2_PAD, 0)


class StubCodebookModel:
    """The codebook models' interface: fixed features per image (images carry their row), the real `quantize`
    without noise, a decoder whose logits are mean_n(feats) @ W + P[t]."""

    cfg = types.SimpleNamespace(num_codes=K)

    def __init__(self, aux: float | None = None):
        self.aux = aux  # the OCR-2 decoder also returns its router balance

    def encode(self, images):
        return jnp.asarray(H)[images[:, 0, 0]]

    def vq(self, h, rng=None):
        return quantize(h, jnp.asarray(CODEBOOK))

    def decoder_logits(self, feats, *inputs):
        logits = jnp.einsum("bd,dv->bv", feats.mean(1), jnp.asarray(W_DEC))[:, None] + jnp.asarray(P_DEC)[None]
        return logits if self.aux is None else (logits, jnp.float32(self.aux))


def _codebook_terms(targets: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per image: CE(H_st) and CE(H) summed over its target characters, sum_i ||h_i - c_{a_i}||^2 over its N
    latents; and the number of targets."""
    h = H.astype(np.float64)
    cb = CODEBOOK.astype(np.float64)
    c = cb[np.argmin(((h[:, :, None, :] - cb[None, None]) ** 2).sum(-1), -1)]  # [B, N, D], nearest codes
    mask = targets != pad

    def ce(feats):
        logp = _log_softmax64(feats.mean(1)[:, None] @ W_DEC.astype(np.float64) + P_DEC.astype(np.float64)[None])
        nll = -np.take_along_axis(logp, np.maximum(targets, 0)[..., None], -1)[..., 0]
        return (nll * mask).sum(1)

    return ce(c), ce(h), ((h - c) ** 2).sum((1, 2)), int(mask.sum())


def _paper_codebook(targets: np.ndarray, pad: int, alpha: np.ndarray | None, reduction: str) -> float:
    """CE(H_st) + alpha CE(H) + lambda_VQ (sum_i ||sg(h_i) - c_{a_i}||^2 + beta sum_i ||h_i - sg(c_{a_i})||^2)."""
    ce_q, ce_c, vq, ntok = _codebook_terms(targets, pad)
    ce_c = ce_c * (alpha if alpha is not None else 0.0)
    commit = vq  # the same value; only its gradient differs (sg on the other side)
    if reduction == "sum":
        return float(np.mean(ce_q + ce_c + LAMBDA * (vq + BETA * commit)))
    return float(ce_q.sum() / ntok + ce_c.sum() / ntok + LAMBDA * (vq.sum() + BETA * commit.sum()) / H.size)


def _codebook_batch(targets: np.ndarray, alpha: np.ndarray | None) -> dict:
    batch = {"images": jnp.arange(B, dtype=jnp.int32).reshape(B, 1, 1), "targets": jnp.asarray(targets)}
    return batch if alpha is None else batch | {"alpha": jnp.asarray(alpha, jnp.float32)}


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("alpha", [None, np.array([1.0, 0.5, 0.25])])
def test_codebook_loss_is_the_papers_equation(reduction, alpha):
    loss_sum, weight, met = codebook.codebook_loss(StubCodebookModel(), _codebook_batch(CHAR_TARGETS, alpha),
                                                   jax.random.key(0), lambda_vq=LAMBDA, beta=BETA, dropout=0.0,
                                                   reduction=reduction)
    want = _paper_codebook(CHAR_TARGETS, VOCAB.PAD, alpha, reduction)
    np.testing.assert_allclose(float(loss_sum) / float(weight), want, rtol=RTOL)
    assert float(weight) == (B if reduction == "sum" else sum(LENGTHS))
    # logged per character / element whichever is optimised: the trainer divides metric sums by `tokens`
    ce_q, _, vq, ntok = _codebook_terms(CHAR_TARGETS, VOCAB.PAD)
    assert float(met["tokens"]) == ntok
    np.testing.assert_allclose(float(met["ce_q"]) / ntok, ce_q.sum() / ntok, rtol=RTOL)
    np.testing.assert_allclose(float(met["vq"]) / ntok, vq.sum() / H.size, rtol=RTOL)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_ocr2_codebook_loss_is_the_papers_equation(reduction):
    """Over the checkpoint's tokens; the router balance (not the paper's) keeps its weight under both."""
    alpha = np.array([0.3, 0.3, 0.3])
    loss_sum, weight, _ = codebook_ocr2.ocr2_codebook_loss(
        StubCodebookModel(aux=0.2), _codebook_batch(TOKEN_TARGETS, alpha), jax.random.key(0), lambda_vq=LAMBDA,
        beta=BETA, router_aux_coef=0.5, reduction=reduction)
    want = _paper_codebook(TOKEN_TARGETS, OCR2_PAD, alpha, reduction) + 0.5 * 0.2
    np.testing.assert_allclose(float(loss_sum) / float(weight), want, rtol=RTOL)


def test_the_codebook_stage_trains_its_configured_reduction():
    for init_from in ("", "/nowhere/ocr2"):  # from scratch | DeepSeek-OCR-2 (a partial: nothing is read)
        for reduction in ("sum", "mean"):
            cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"codebook.train.loss_reduction={reduction}",
                                                               f"codebook.init_from={init_from}"])
            assert codebook.main_phase_loss(cfg).keywords["reduction"] == reduction


def test_codebook_warmup_loss_reductions():
    model = StubCodebookModel()
    batch = _codebook_batch(CHAR_TARGETS, None)
    s, w, _ = codebook.warmup_loss(model, batch, jax.random.key(0), dropout=0.0, reduction="sum")
    s_mean, w_mean, _ = codebook.warmup_loss(model, batch, jax.random.key(0), dropout=0.0, reduction="mean")
    assert float(s) == float(s_mean) and (float(w), float(w_mean)) == (B, sum(LENGTHS))
    with pytest.raises(ValueError, match="loss reduction"):
        codebook.warmup_loss(model, batch, jax.random.key(0), dropout=0.0, reduction="token")


# ----------------------------------------------------------------------------------------------
# The LM's CE (textsft, align, sft) and sft's dual branch.

LM_V, LM_T = 13, 10
W_LM = RS.normal(size=(LM_V, LM_V)).astype(np.float32)  # a bigram table: logits[t] = W[x_t] + 0.01 * pos_t
VOCAB_MASK = np.ones(LM_V, bool)
VOCAB_MASK[-2:] = False  # padded rows: never a target, filled with -1e9 by the loss
# row 0 packs two examples; row 1's first example has no target (a prompt only); row 2 is padding; row 3 packs
# three: 6 examples with a target in 4 rows
SEG = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0], [1, 1, 1, 2, 2, 2, 2, 2, 2, 2], [0] * LM_T,
                [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]], np.int32)
LOSS_MASK = np.array([[0, 0, 1, 1, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1], [0] * LM_T,
                      [0, 1, 1, 0, 1, 1, 0, 0, 1, 1]], np.int32)


class Bigram:
    """`model(tokens, positions=, segment_ids=) -> logits`, the form `next_token_stats` reads."""

    def __call__(self, tokens, positions, segment_ids):
        return jnp.asarray(W_LM)[tokens] + 0.01 * positions[..., None].astype(jnp.float32)


def _positions(seg: np.ndarray) -> np.ndarray:
    pos = np.zeros_like(seg)
    for b in range(seg.shape[0]):
        for t in range(1, seg.shape[1]):
            pos[b, t] = pos[b, t - 1] + 1 if seg[b, t] == seg[b, t - 1] else 0
    return pos


def _lm_batch(seg: np.ndarray, loss_mask: np.ndarray) -> dict:
    tokens = RS.randint(0, LM_V - 2, seg.shape).astype(np.int32)
    return {"tokens": tokens, "loss_mask": loss_mask, "segment_ids": seg, "positions": _positions(seg)}


def _paper_lm(batch: dict) -> list[float]:
    """Each example's CE, -sum_t log p(x_t | x_<t), over its targets (examples without one are not listed)."""
    logits = W_LM.astype(np.float64)[batch["tokens"]] + 0.01 * batch["positions"][..., None]
    logits[..., ~VOCAB_MASK] = -1e9
    logp = _log_softmax64(logits)
    out = []
    seg, tok, lm = batch["segment_ids"], batch["tokens"], batch["loss_mask"]
    for b in range(seg.shape[0]):
        for s in set(seg[b].tolist()) - {0}:
            ts = [t for t in range(1, seg.shape[1]) if seg[b, t] == s == seg[b, t - 1] and lm[b, t]]
            if ts:
                out.append(-sum(logp[b, t - 1, tok[b, t]] for t in ts))
    return out


def _reduce(per_example: list[float], count: int, reduction: str) -> float:
    return float(np.mean(per_example) if reduction == "sum" else np.sum(per_example) / count)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_lm_loss_is_the_papers_equation(reduction):
    batch = _lm_batch(SEG, LOSS_MASK)
    loss_sum, weight, met = common.lm_loss(Bigram(), {k: jnp.asarray(v) for k, v in batch.items()},
                                           jax.random.key(0), vocab_mask=jnp.asarray(VOCAB_MASK), reduction=reduction)
    per_example = _paper_lm(batch)
    ntok = 2 + 3 + 6 + 2 + 2 + 2  # the targets of the six examples that have any
    assert len(per_example) == 6 and float(met["tokens"]) == ntok
    assert float(weight) == (6 if reduction == "sum" else ntok)
    np.testing.assert_allclose(float(loss_sum) / float(weight), _reduce(per_example, ntok, reduction), rtol=RTOL)
    np.testing.assert_allclose(float(met["ce"]) / ntok, sum(per_example) / ntok, rtol=RTOL)  # logged per token


OCR_T, OCR_N = 8, 3
E_OCR = RS.normal(size=(9, D)).astype(np.float32)  # what the OCR branch reads for each code
OCR_LENGTHS = (8, 3, 6)


class StubDualBranch:
    """DualBranchLM's interface: `.lm`, `.ocr` (not an OCR-2 branch) and `ocr_logits` = mean over the valid
    codes of E[code] @ W + P[t]."""

    lm = Bigram()
    ocr = types.SimpleNamespace()

    def ocr_logits(self, codes, code_mask, inputs, in_mask):
        m = code_mask.astype(jnp.float32)[..., None]
        feats = jnp.sum(jnp.asarray(E_OCR)[codes] * m, 1) / jnp.sum(m, 1)
        return (feats @ jnp.asarray(W_DEC))[:, None] + jnp.asarray(P_DEC)[None, :OCR_T]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_dual_branch_loss_is_the_papers_equation(reduction):
    """sum: per example, its LM CE over its tokens + w * its OCR CE over its characters; averaged over the batch."""
    seg = np.array([[1] * LM_T, [1] * 7 + [0] * 3, [1] * LM_T], np.int32)  # unpacked rows, one example each
    loss_mask = np.array([[0] * 4 + [1] * 6, [0] * 3 + [1] * 4 + [0] * 3, [0] * 2 + [1] * 8], np.int32)
    batch = _lm_batch(seg, loss_mask)
    targets = np.full((3, OCR_T), VOCAB.PAD, np.int32)
    for b, n in enumerate(OCR_LENGTHS):
        targets[b, :n] = RS.randint(VOCAB.NUM_SPECIAL, V, n)
    codes = RS.randint(0, len(E_OCR), (3, OCR_N)).astype(np.int32)
    code_mask = np.array([[1, 1, 1], [0, 1, 1], [0, 0, 1]], np.int32)  # left-padded
    batch |= {"ocr_targets": targets, "ocr_codes": codes, "ocr_code_mask": code_mask}
    w = 0.7
    loss_sum, weight, met = sft.dual_branch_loss(StubDualBranch(), {k: jnp.asarray(v) for k, v in batch.items()},
                                                 jax.random.key(0), vocab_mask=jnp.asarray(VOCAB_MASK), weight=w,
                                                 reduction=reduction)
    lm = np.array(_paper_lm(batch))
    feats = np.stack([E_OCR[codes[b]][code_mask[b] > 0].astype(np.float64).mean(0) for b in range(3)])
    logp = _log_softmax64(feats[:, None] @ W_DEC.astype(np.float64) + P_DEC[None, :OCR_T].astype(np.float64))
    ocr_mask = targets != VOCAB.PAD
    ocr = (-np.take_along_axis(logp, targets[..., None], -1)[..., 0] * ocr_mask).sum(1)
    n_lm, n_ocr = int(loss_mask[:, 1:].sum()), int(ocr_mask.sum())
    want = np.mean(lm + w * ocr) if reduction == "sum" else lm.sum() / n_lm + w * ocr.sum() / n_ocr
    np.testing.assert_allclose(float(loss_sum) / float(weight), want, rtol=RTOL)
    assert float(weight) == (3 if reduction == "sum" else n_lm)
    # the logged means, whichever is optimised: per LM token and per OCR character
    tokens = float(met["tokens"])
    assert tokens == n_lm and "ce" not in met
    np.testing.assert_allclose(float(met["lm_ce"]) / tokens, lm.sum() / n_lm, rtol=RTOL)
    np.testing.assert_allclose(float(met["ocr_ce"]) / tokens, ocr.sum() / n_ocr, rtol=RTOL)
