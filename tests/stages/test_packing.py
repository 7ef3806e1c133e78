"""Packed rows train exactly what padded rows train (textsft, align, sft, and sft with its dual branch, whose packed
batches carry one OCR row per segment), and a packed segment never sees another.

The equality holds because `stages.common.lm_loss` returns a sum over target tokens and their count (the
Trainer divides one by the other over the whole batch): the same examples give the same sum and count however
they are laid out in rows. The tests that would fail with a wrong attention mask are the equality tests
and `test_a_packed_segment_sees_only_itself`; each also checks that merging two segments (the mask a packer
without segment ids would give) changes the numbers, so they cannot pass on a mask that ignores segments.
"""

import itertools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig, load_config
from dlr_jax.data.latents import random_latents
from dlr_jax.data.pipeline import BATCH_KEYS, make_stage_dataset
from dlr_jax.data.synthetic import generate
from dlr_jax.models.latent_lm import LatentLM, filter_for_stage
from dlr_jax.models.transformer import Transformer
from dlr_jax.stages.common import lm_loss
from dlr_jax.text.tokens import Tokenizer, train_bpe

ROOT = Path(__file__).resolve().parents[2]
K, MAX_LEN, TOL = 32, 192, 1e-5


@pytest.fixture(scope="module")
def setup():
    examples = generate(24, seed=4)
    base = train_bpe([f"{e.question}\n{e.cot}{e.answer}" for e in generate(200, seed=1)], vocab_size=512,
                     num_latents=K)
    text_rows = -(-base.text_vocab_size // 64) * 64
    tok = Tokenizer(base.backend, num_latents=K, pad_multiple=64, min_text_vocab_size=text_rows)
    mcfg = ModelConfig(vocab_size=tok.text_vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=2, num_kv_heads=1, head_dim=16, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    backbone = Transformer(mcfg, rngs=nnx.Rngs(params=0))
    lm = LatentLM.from_backbone(Transformer(mcfg, rngs=nnx.Rngs(params=1)), tok, latent_dim=16,
                                rngs=nnx.Rngs(params=2))
    return examples, tok, random_latents(examples, K, seed=0), backbone, lm


def _one_batch(stage, examples, tok, table, *, pack):
    """Every example once, padded one a row or packed, as one batch (the rows of all the pipeline's batches)."""
    ds = make_stage_dataset(stage, examples, tok, batch_size=4, max_len=MAX_LEN, seed=0, latents=table, pack=pack,
                            num_epochs=1, drop_remainder=False, shard_index=0, shard_count=1, num_threads=0)
    batches = list(ds)
    return {k: np.concatenate([b[k] for b in batches]) for k in BATCH_KEYS}


def _loss_and_grads(model, trainable, batch, vocab_mask):
    """The Trainer's objective for one step: sum of the target tokens' NLL / their count, and its gradients."""
    graphdef, params, rest = nnx.split(model, trainable, ...)

    def f(p):
        total, count, _ = lm_loss(nnx.merge(graphdef, p, rest), batch, None, vocab_mask=vocab_mask)
        return total / jnp.maximum(count, 1.0), count

    (loss, count), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return float(loss), float(count), grads


def _merged(batch):
    """The packed rows with every segment in one: what a mask that ignores segment ids would see."""
    return batch | {"segment_ids": (batch["segment_ids"] > 0).astype(np.int32)}


@pytest.mark.parametrize("stage", ["textsft", "align", "sft"])
def test_packed_and_padded_give_the_same_loss_and_gradients(stage, setup):
    examples, tok, table, backbone, lm = setup
    if stage == "textsft":
        model, trainable, vocab_mask = backbone, nnx.Param, tok.vocab_padding_mask()[: tok.text_vocab_size]
    else:
        model, trainable, vocab_mask = lm, filter_for_stage(stage, lm.latent_cfg), lm.vocab_mask()
    padded = _one_batch(stage, examples, tok, table, pack=False)
    packed = _one_batch(stage, examples, tok, table, pack=True)
    assert packed["tokens"].shape[0] < padded["tokens"].shape[0] // 2  # several examples a row
    assert (packed["segment_ids"].max(axis=1) > 1).any()
    loss_a, count_a, grads_a = _loss_and_grads(model, trainable, padded, vocab_mask)
    loss_b, count_b, grads_b = _loss_and_grads(model, trainable, packed, vocab_mask)
    assert count_a == count_b > 0  # the same target tokens: the prompt masked in textsft/sft, not in align
    np.testing.assert_allclose(loss_b, loss_a, rtol=TOL, atol=TOL)
    flat_a, flat_b = nnx.to_flat_state(grads_a), nnx.to_flat_state(grads_b)
    assert [k for k, _ in flat_a] == [k for k, _ in flat_b]
    for (path, ga), (_, gb) in zip(flat_a, flat_b, strict=True):
        np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), rtol=TOL, atol=TOL, err_msg=str(path))
    # the same rows with their segments merged: tokens of one example attend to another's; loss and gradients move
    loss_m, count_m, grads_m = _loss_and_grads(model, trainable, _merged(packed), vocab_mask)
    gap = max(float(np.abs(np.asarray(gm) - np.asarray(ga)).max())
              for (_, gm), (_, ga) in zip(nnx.to_flat_state(grads_m), flat_a, strict=True))
    assert count_m == count_a  # no sequence's first token is a target, so only attention changed
    assert abs(loss_m - loss_a) > 10 * TOL and gap > 100 * TOL


@pytest.mark.parametrize("which", ["backbone", "latent_lm"])
def test_a_packed_segment_sees_only_itself(which, setup):
    _, tok, _, backbone, lm = setup
    model = backbone if which == "backbone" else lm
    rng = np.random.default_rng(0)
    vocab = tok.text_vocab_size if which == "backbone" else tok.total_vocab_size
    a, b = rng.integers(1, vocab, 20), rng.integers(1, vocab, 30)
    t = 64

    def row(*segs, merged=False):
        tokens, seg, pos, n = np.full(t, tok.pad_id), np.zeros(t, np.int32), np.zeros(t, np.int32), 0
        for i, s in enumerate(segs):
            tokens[n:n + len(s)], seg[n:n + len(s)] = s, 1 if merged else i + 1
            pos[n:n + len(s)] = np.arange(len(s))
            n += len(s)
        return model(jnp.asarray(tokens[None]), positions=jnp.asarray(pos[None]), segment_ids=jnp.asarray(seg[None]))

    alone = np.asarray(row(b))[0, :30]
    packed = np.asarray(row(a, b))[0, 20:50]
    np.testing.assert_allclose(packed, alone, rtol=TOL, atol=TOL)  # b after a = b alone
    other = rng.integers(1, vocab, 20)
    np.testing.assert_allclose(np.asarray(row(other, b))[0, 20:50], alone, rtol=TOL, atol=TOL)  # whatever a is
    np.testing.assert_allclose(np.asarray(row(a, b))[0, :20], np.asarray(row(a))[0, :20], rtol=TOL, atol=TOL)
    merged = np.asarray(row(a, b, merged=True))[0, 20:50]
    assert np.abs(merged - alone).max() > 1e-3  # a mask without segments lets b read a


MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=96", "data.synthetic_eval=8",
    "data.max_len=256", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", f"latent.num_latents={K}",
    "latent.latent_dim=16", "latent.source=random", "latent.dual_branch=off", "mesh.fsdp=1", "data.pack=true",
]
for _s in ("textsft", "align", "sft"):
    MICRO += [f"train.{_s}.batch_size=8", f"train.{_s}.num_epochs=1", f"train.{_s}.progress=false",
              f"train.{_s}.async_checkpointing=false", f"train.{_s}.log_every=1"]


def test_stages_train_on_packed_rows(tmp_path):
    from dlr_jax.stages import align, sft, textsft

    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO)
    textsft.run(cfg, tmp_path, "cot")
    align.run(cfg, tmp_path)
    sft.run(cfg, tmp_path)
    for stage in ("textsft_cot", "align", "sft"):
        schedule = json.loads((tmp_path / stage / "schedule.json").read_text())
        packed = schedule["packed"]
        # an epoch of packed rows is fewer steps than one of padded rows
        assert packed["examples_per_row"] > 1.2
        assert schedule["num_steps"] < -(-schedule["examples"] // 8)
        rows = [json.loads(line) for line in (tmp_path / stage / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == schedule["num_steps"]
        assert all(0.5 < r["pack_efficiency"] <= 1 and r["sequences"] > 8 for r in rows), stage


# ----------------------------------------------------------------------------------------------
# Stage sft's dual branch on packed rows: one OCR row per segment (`data.ocr_rows`), the same loss as padded rows.

OCR_LEN = 64


def _step_table(examples):
    """Two codes a CoT step (codebook.render_unit=step), so a step's codes and text pair up."""
    from dlr_jax.data.latents import LatentTable
    from dlr_jax.text.steps import split_steps

    latents, steps = {}, {}
    for n, ex in enumerate(examples):
        s = len(split_steps(ex.cot))
        latents[ex.id] = [(8 * n + 2 * j + t) % K for j in range(s) for t in (0, 1)]
        steps[ex.id] = [2] * s
    return LatentTable(latents, num_codes=K, steps=steps)


def _ocr_batch(examples, tok, table, unit, *, pack, seed=0):
    """Every example once as one batch, with the dual branch's OCR fields; two epochs under `step` would draw two
    steps, one is enough: the draw follows the global stream position, the same padded or packed."""
    ds = make_stage_dataset("sft", examples, tok, batch_size=4, max_len=MAX_LEN, seed=seed, latents=table, pack=pack,
                            num_epochs=1, drop_remainder=False, shard_index=0, shard_count=1, num_threads=0,
                            ocr_text_len=OCR_LEN, ocr_unit=unit)
    batches = list(ds)
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _by_example(batch, examples, tok, table):
    """{example id: its OCR fields} of a batch, each segment named by its tokens; packed batches read slot j - 1 for
    segment j."""
    from dlr_jax.data.items import Item, build_sequence

    names = {tuple(build_sequence("sft", tok, Item(ex, tuple(table[ex.id]))).tokens.tolist()): ex.id for ex in examples}
    out = {}
    for r in range(batch["tokens"].shape[0]):
        seg = batch["segment_ids"][r]
        for j in range(1, int(seg.max()) + 1):
            name = names[tuple(batch["tokens"][r][seg == j].tolist())]
            slot = (lambda k, r=r, j=j: batch[k][r, j - 1]) if batch["ocr_codes"].ndim == 3 else \
                (lambda k, r=r: batch[k][r])
            out[name] = {k: slot(k) for k in ("ocr_targets", "ocr_codes", "ocr_code_mask")}
    return out


@pytest.mark.parametrize("unit", ["chain", "step"])
def test_packed_ocr_rows_hold_their_own_segment(unit, setup):
    from dlr_jax.data.cot_view import step_views
    from dlr_jax.data.curriculum import ocr_step
    from dlr_jax.text.ocr_text import VOCAB, encode_target

    examples, tok, chain, _, _ = setup
    table = chain if unit == "chain" else _step_table(examples)
    packed = _ocr_batch(examples, tok, table, unit, pack=True)
    b, slots = packed["ocr_segment_ids"].shape
    assert packed["ocr_targets"].shape == (b, slots, OCR_LEN) and packed["ocr_codes"].shape[:2] == (b, slots)
    nseg = packed["segment_ids"].max(axis=1)
    assert (nseg > 1).any() and slots >= nseg.max()
    # slot j - 1 holds segment j; the rest are empty rows: every target padding, nothing for the loss
    want_ids = np.where(np.arange(1, slots + 1)[None] <= nseg[:, None], np.arange(1, slots + 1)[None], 0)
    np.testing.assert_array_equal(packed["ocr_segment_ids"], want_ids)
    assert (packed["ocr_targets"][want_ids == 0] == VOCAB.PAD).all()
    rows = _by_example(packed, examples, tok, table)
    assert len(rows) == len(examples)
    padded = _by_example(_ocr_batch(examples, tok, table, unit, pack=False), examples, tok, table)
    order = [ex.id for ex in examples]
    for n, ex in enumerate(examples):
        got = rows[ex.id]
        for k in got:  # what a padded row of the same example holds
            np.testing.assert_array_equal(got[k], padded[ex.id][k], err_msg=f"{ex.id} {k}")
        codes = got["ocr_codes"][got["ocr_code_mask"] > 0].tolist()
        if unit == "chain":  # its own codes and its own CoT, not a neighbour's
            assert codes == list(table[ex.id])
            np.testing.assert_array_equal(got["ocr_targets"], encode_target(ex.cot, OCR_LEN)[0])
        else:  # the step drawn for it, as in padded rows
            j = ocr_step(0, ex.id, 0, len(table.step_counts(ex.id)))
            assert codes == list(table[ex.id])[2 * j:2 * j + 2], (order.index(ex.id), n)
            np.testing.assert_array_equal(got["ocr_targets"], encode_target(step_views(ex.cot, "cot")[j], OCR_LEN)[0])


@pytest.fixture(scope="module")
def dual(setup):
    """A `DualBranchLM` as sft trains it: the latent LM and a micro character decoder (fresh weights)."""
    from dlr_jax.models.codebook_model import CodebookModelConfig
    from dlr_jax.models.dual_branch import OCR_PARAMS, DualBranchLM, OCRBranch
    from tests.micro import codebook_nets

    _, _, _, _, lm = setup
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [
        f"latent.num_latents={K}", "latent.latent_dim=16", "codebook.max_side=128", "codebook.image_size=128",
        f"codebook.max_text_len={OCR_LEN}", *codebook_nets(num_queries=9)])
    d, dcfg = lm.backbone.cfg.hidden_size, CodebookModelConfig.from_config(cfg)
    # a prefix map larger than the default init, so that what a row's codes say moves its loss clearly (a fresh
    # decoder barely reads a prefix of the default scale): the tests then see codes and targets mismatched
    proj = 3.0 * jax.random.normal(jax.random.key(6), (d, dcfg.decoder.hidden_size))
    ocr = OCRBranch(dcfg, d, rngs=nnx.Rngs(params=5), prefix_proj=proj)
    return DualBranchLM(lm, ocr), nnx.Any(filter_for_stage("sft", lm.latent_cfg), OCR_PARAMS)


def _dual_loss_and_grads(model, trainable, batch, reduction):
    """The Trainer's objective with the dual branch (weight 0.5, no char dropout), its metrics with the OCR target
    count `ocr_chars`, and its gradients."""
    from dlr_jax.stages.sft import dual_branch_loss, ocr_terms

    graphdef, params, rest = nnx.split(model, trainable, ...)
    vocab_mask = model.lm.vocab_mask()

    def f(p):
        m, key = nnx.merge(graphdef, p, rest), jax.random.key(0)
        total, weight, met = dual_branch_loss(m, batch, key, vocab_mask=vocab_mask, weight=0.5, reduction=reduction)
        return total / jnp.maximum(weight, 1.0), met | {"ocr_chars": ocr_terms(m, batch, key)[1]}

    (loss, met), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return float(loss), {k: float(v) for k, v in met.items()}, grads


@pytest.mark.parametrize(("unit", "reduction"), [("chain", "mean"), ("chain", "sum"), ("step", "mean")])
def test_dual_branch_packed_and_padded_give_the_same_loss_and_gradients(unit, reduction, setup, dual):
    examples, tok, chain, _, _ = setup
    model, trainable = dual
    table = chain if unit == "chain" else _step_table(examples)
    padded = _ocr_batch(examples, tok, table, unit, pack=False)
    packed = _ocr_batch(examples, tok, table, unit, pack=True)
    assert packed["tokens"].shape[0] < padded["tokens"].shape[0] // 2  # several examples a row
    loss_a, met_a, grads_a = _dual_loss_and_grads(model, trainable, padded, reduction)
    loss_b, met_b, grads_b = _dual_loss_and_grads(model, trainable, packed, reduction)
    assert met_a["ocr_ce"] > 0 and met_a["ocr_chars"] == met_b["ocr_chars"] > 0
    for k in ("lm_ce", "ocr_ce", "ocr_char_accuracy", "tokens"):
        np.testing.assert_allclose(met_b[k], met_a[k], rtol=TOL, atol=TOL, err_msg=k)
    np.testing.assert_allclose(loss_b, loss_a, rtol=TOL, atol=TOL)
    flat_a, flat_b = nnx.to_flat_state(grads_a), nnx.to_flat_state(grads_b)
    assert [k for k, _ in flat_a] == [k for k, _ in flat_b] and any("ocr" in map(str, k) for k, _ in flat_a)
    for (path, ga), (_, gb) in zip(flat_a, flat_b, strict=True):
        np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), rtol=TOL, atol=TOL, err_msg=str(path))
    # each segment's codes read with the next segment's targets (slots shifted by one): the OCR loss moves
    shifted = packed | {"ocr_targets": np.roll(packed["ocr_targets"], 1, axis=1)}
    loss_s, met_s, _ = _dual_loss_and_grads(model, trainable, shifted, reduction)
    assert abs(met_s["ocr_ce"] - met_a["ocr_ce"]) > 100 * TOL


def test_sft_accepts_the_dual_branch_on_packed_rows():
    from dlr_jax.stages.sft import dual_branch_on

    for mode in ("auto", "on"):
        cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"latent.dual_branch={mode}", "latent.source=codebook",
                                                           "data.pack=true"])
        assert cfg.data.pack and dual_branch_on(cfg, "codebook", "codebook/final")
        assert dual_branch_on(cfg, "ocr2", "codebook/final")


# ----------------------------------------------------------------------------------------------
# The same on a DeepSeek-OCR-2 codebook: sft's branch is its MoE decoder (`models.ocr2_branch.Ocr2Branch`), whose
# targets are the checkpoint's tokens padded with OCR-2's PAD; an unused slot is padded as the pipeline pads it.

OCR2_K, OCR2_LEN, OCR2_CODES = 16, 12, 5
# (codes, text) of six examples: codes of every length up to the row's N, texts short, long (cut) and empty; the last
# has no latent step to read back (a latent curriculum's k = 0: every target the padding, `ocr_rows.ocr_fields`)
OCR2_EXAMPLES = [([3, 1, 4, 1, 5], "12+3=15"), ([9], "7*6"), ([2, 6], "a long CoT, cut"), ([5, 3, 5, 8], ""),
                 ([9, 7, 9], "x=4"), ([3, 2], None)]
OCR2_ROWS = [[0, 1, 2], [3, 4], [5]]  # the segments of three packed rows: slots 3 (S), some unused


@pytest.fixture(scope="module")
def ocr2_dual(tmp_path_factory):
    """(a `DualBranchLM` with an OCR-2 branch, the checkpoint's target encoder): the tiny DeepSeek-OCR-2 with its
    tokenizer, the branch as sft builds it from the codebook stage's model (`ocr2_branch_from_codebook_model`)."""
    from dlr_jax.convert.ocr2 import load_ocr2
    from dlr_jax.models.dual_branch import DualBranchLM
    from dlr_jax.models.latent_lm import LatentConfig, build_latent_lm
    from dlr_jax.models.ocr2_branch import ocr2_branch_from_codebook_model
    from dlr_jax.models.ocr2_codebook import Ocr2CodebookConfig, Ocr2CodebookModel
    from dlr_jax.stages.codebook.ocr2 import OcrTokenEncoder
    from tests.hf_fixtures import save_tiny_ocr2

    d = tmp_path_factory.mktemp("ocr2")
    save_tiny_ocr2(d, seed=0, small=True)
    ocfg, ocr2 = load_ocr2(d)
    cfg = Ocr2CodebookConfig(ocfg, OCR2_K, max_text_len=OCR2_LEN, prompt_ids=(5, 6))
    cbm = Ocr2CodebookModel(cfg, rngs=nnx.Rngs(0))
    cbm.ocr2 = ocr2
    mcfg = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=64, num_layers=1, num_heads=2,
                       num_kv_heads=1, head_dim=16)
    lm = build_latent_lm(mcfg, LatentConfig(num_latents=OCR2_K, latent_dim=ocfg.d_c, latent_offset=64,
                                            total_vocab_size=96),
                         codebook=cbm.vq.codebook[...], rngs=nnx.Rngs(params=jax.random.key(1, impl="rbg")))
    return DualBranchLM(lm, ocr2_branch_from_codebook_model(cbm, lm)), OcrTokenEncoder(d / "tokenizer.json", cfg.eos_id)


def _ocr2_rows(encode):
    """Each example's `OCR_KEYS` row as the pipeline makes it: codes left-padded to N, targets in tokens."""
    from dlr_jax.data.ocr_rows import left_pad, pad_target

    rows = []
    for n, (codes, text) in enumerate(OCR2_EXAMPLES):
        c, m = left_pad(codes, OCR2_CODES, f"ex{n}")
        t = encode(text or "", OCR2_LEN)[0]
        if text is None:  # nothing to read back: the padding throughout, as `ocr_fields` writes it
            t = np.full_like(t, pad_target(encode, OCR2_LEN))
        rows.append({"ocr_targets": t, "ocr_codes": c, "ocr_code_mask": m})
    return rows


def _ocr2_batches(encode):
    """(padded: one OCR row a token row [6, ...], packed: `OCR2_ROWS` as [3, S, ...] with `ocr_segment_ids`, the
    unused slots holding `ocr_rows.slot_structs`'s padding) of the same examples."""
    from dlr_jax.data.ocr_rows import OCR_KEYS, slot_structs

    rows = _ocr2_rows(encode)
    padded = {k: np.stack([r[k] for r in rows]) for k in OCR_KEYS}
    slots = max(map(len, OCR2_ROWS))
    _, pads = slot_structs(slots, OCR2_LEN, encode)
    packed = {k: np.full((len(OCR2_ROWS), slots, padded[k].shape[1]), pads[k], np.int32) for k in OCR_KEYS}
    packed["ocr_segment_ids"] = np.zeros((len(OCR2_ROWS), slots), np.int32)
    for r, segs in enumerate(OCR2_ROWS):
        for j, n in enumerate(segs):
            for k in OCR_KEYS:
                packed[k][r, j] = rows[n][k]
            packed["ocr_segment_ids"][r, j] = j + 1
    return padded, packed


def _ocr_terms_and_grads(model, batch):
    """`stages.sft.ocr_terms` (Σ NLL, #targets, #right) on the batch and the gradients of Σ NLL (fp32)."""
    from dlr_jax.stages.sft import ocr_terms

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def f(p):
        s, n, right = ocr_terms(nnx.merge(graphdef, p, rest), batch, jax.random.key(0))
        return s, (n, right)

    (s, (n, right)), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return (float(s), float(n), float(right)), grads


def test_ocr2_branch_packed_and_padded_give_the_same_ocr_terms_and_gradients(ocr2_dual):
    from dlr_jax.models.ocr2_branch import Ocr2Branch
    from dlr_jax.models.ocr2_codebook import PAD as OCR2_PAD

    model, encode = ocr2_dual
    assert isinstance(model.ocr, Ocr2Branch) and jnp.dtype(model.ocr.cfg.ocr2.text.base.dtype) == jnp.float32
    padded, packed = _ocr2_batches(encode)
    unused = packed["ocr_segment_ids"] == 0
    assert unused.sum() == 3 and (packed["ocr_targets"][unused] == OCR2_PAD).all()  # slot_structs's OCR-2 padding
    assert (padded["ocr_targets"][-1] == OCR2_PAD).all()  # and a real row with nothing to read back
    terms_a, grads_a = _ocr_terms_and_grads(model, padded)
    terms_b, grads_b = _ocr_terms_and_grads(model, packed)
    assert terms_a[1] == terms_b[1] == (padded["ocr_targets"] != OCR2_PAD).sum() and np.isfinite(terms_a[0])
    np.testing.assert_allclose(terms_b, terms_a, rtol=TOL, atol=TOL)
    flat_a, flat_b = nnx.to_flat_state(grads_a), nnx.to_flat_state(grads_b)
    assert [k for k, _ in flat_a] == [k for k, _ in flat_b]
    assert any(np.abs(np.asarray(g)).max() > 0 for k, g in flat_a if "moe" in map(str, k))  # the experts learn
    for (path, ga), (_, gb) in zip(flat_a, flat_b, strict=True):
        assert np.isfinite(np.asarray(gb)).all(), path
        np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), rtol=TOL, atol=TOL, err_msg=str(path))
    # each segment's codes read with another slot's targets (slots shifted by one): the OCR loss moves, so the
    # equality above needs every slot to hold its own segment's codes and targets
    shifted = packed | {"ocr_targets": np.roll(packed["ocr_targets"], 1, axis=1)}
    moved, _ = _ocr_terms_and_grads(model, shifted)
    assert abs(moved[0] - terms_a[0]) > 100 * TOL


def test_stages_train_on_packed_steps_of_batch_size_examples_and_resume(tmp_path, capsys):
    """data.pack_batch=examples: a step's rows hold about batch_size examples (not batch_size rows of several each),
    so an epoch is about as many steps as padded; a run stopped part way resumes to the uninterrupted run's steps."""
    from dlr_jax.stages import align, textsft

    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "data.pack_batch=examples"])
    textsft.run(cfg, tmp_path / "whole", "cot")
    textsft.run(cfg, tmp_path / "resumed", "cot", num_steps=3)
    textsft.run(cfg, tmp_path / "resumed", "cot")
    align.run(cfg, tmp_path / "whole")
    out = capsys.readouterr().out
    for w, stage in ((tmp_path / "whole", "textsft_cot"), (tmp_path / "whole", "align"),
                     (tmp_path / "resumed", "textsft_cot")):
        schedule = json.loads((w / stage / "schedule.json").read_text())
        packed, rows = schedule["packed"], schedule["per_step"]
        assert schedule["pack_batch"] == "examples" and schedule["batch_examples"] == 8
        assert packed["examples_per_row"] > 1.2 and rows < 8  # fewer rows a step than examples
        padded_steps = -(-schedule["examples"] // 8)
        assert abs(schedule["num_steps"] - padded_steps) <= max(1, 0.1 * padded_steps), schedule
        assert f"[{stage}] packed: {rows} rows of 256 a step hold " in out
        metrics = [json.loads(line) for line in (w / stage / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in metrics] == list(range(1, schedule["num_steps"] + 1))
        # about batch_size examples a step: rows x examples_per_row (whole rows: textsft 4 x 2.2 for 8), not
        # batch_size x examples_per_row as with data.pack_batch=rows
        seen = np.mean([r["sequences"] for r in metrics])
        assert seen == pytest.approx(rows * packed["examples_per_row"], rel=0.15) and seen < 1.5 * 8, seen
    assert "[textsft_cot] resumed from step 3" in out
    whole, resumed = ([json.loads(line) for line in (tmp_path / w / "textsft_cot" / "metrics.jsonl").read_text()
                       .splitlines()] for w in ("whole", "resumed"))
    np.testing.assert_allclose([r["loss"] for r in resumed], [r["loss"] for r in whole], rtol=1e-5)
    assert [r["sequences"] for r in resumed] == [r["sequences"] for r in whole]


def test_exact_packing_trains_the_padded_run_step_for_step(tmp_path, capsys):
    """data.pack_batch=exact: each step's batch_size examples packed (each grad_accum micro-batch apart) into the rows
    the run's fullest micro-batch needs: the same steps, losses and examples a step as the padded run, in fewer rows;
    stopped part way, it resumes to the uninterrupted run's steps."""
    from dlr_jax.stages import align, sft, textsft

    accum = [*(f"train.{s}.grad_accum=2" for s in ("textsft", "align", "sft")), "train.align.loss_reduction=sum"]
    runs = {"padded": [*MICRO, *accum, "data.pack=false"], "exact": [*MICRO, *accum, "data.pack_batch=exact"]}
    for name, overrides in runs.items():
        cfg = load_config(ROOT / "configs" / "tiny.yaml", overrides)
        textsft.run(cfg, tmp_path / name, "cot")
        align.run(cfg, tmp_path / name, num_steps=4 if name == "exact" else None)
        if name == "exact":
            align.run(cfg, tmp_path / name)
        sft.run(cfg, tmp_path / name)
    out = capsys.readouterr().out
    assert "[align] resumed from step 4" in out
    for stage in ("textsft_cot", "align", "sft"):
        metrics = {name: [json.loads(line) for line in (tmp_path / name / stage / "metrics.jsonl").read_text()
                          .splitlines()] for name in runs}
        schedule = json.loads((tmp_path / "exact" / stage / "schedule.json").read_text())
        padded_schedule = json.loads((tmp_path / "padded" / stage / "schedule.json").read_text())
        assert schedule["pack_batch"] == "exact" and schedule["batch_examples"] == 8
        assert schedule["num_steps"] == padded_schedule["num_steps"] == len(metrics["exact"]) > 4
        assert schedule["per_step"] < 8, schedule  # rows a step: fewer than the padded step's 8
        assert f"[{stage}] packed: the 8 examples of a padded step in {schedule['per_step']} rows of 256" in out
        assert [r["sequences"] for r in metrics["exact"]] == [r["sequences"] for r in metrics["padded"]]
        assert all(r["sequences"] == 8 for r in metrics["exact"])
        assert [r["tokens"] for r in metrics["exact"]] == [r["tokens"] for r in metrics["padded"]]
        np.testing.assert_allclose([r["loss"] for r in metrics["exact"]], [r["loss"] for r in metrics["padded"]],
                                   rtol=1e-5, err_msg=stage)


@pytest.mark.parametrize("unit", ["chain", "step"])
def test_exact_packed_dual_branch_steps_give_the_padded_steps_loss_and_gradients(unit, setup, dual):
    """sft's dual branch under data.pack_batch=exact: step j's packed rows (one OCR slot a segment, empty rows
    included) give padded step j's LM and OCR loss and gradients."""
    examples, tok, chain, _, _ = setup
    model, trainable = dual
    table = chain if unit == "chain" else _step_table(examples)
    kw = dict(batch_size=6, max_len=MAX_LEN, seed=1, latents=table, shard_index=0, shard_count=1, num_threads=0,
              ocr_text_len=OCR_LEN, ocr_unit=unit)
    padded = iter(make_stage_dataset("sft", examples, tok, **kw))
    exact = make_stage_dataset("sft", examples, tok, pack=True, pack_batch="exact", horizon_steps=3, **kw)
    assert exact.global_batch < 6
    for j, (a, b) in enumerate(itertools.islice(zip(padded, exact, strict=True), 3)):
        loss_a, met_a, grads_a = _dual_loss_and_grads(model, trainable, a, "mean")
        loss_b, met_b, grads_b = _dual_loss_and_grads(model, trainable, b, "mean")
        assert met_a["ocr_chars"] == met_b["ocr_chars"] > 0
        np.testing.assert_allclose([loss_b, met_b["ocr_ce"]], [loss_a, met_a["ocr_ce"]], rtol=TOL, atol=TOL)
        for (path, ga), (_, gb) in zip(nnx.to_flat_state(grads_a), nnx.to_flat_state(grads_b), strict=True):
            np.testing.assert_allclose(np.asarray(gb), np.asarray(ga), rtol=TOL, atol=TOL, err_msg=f"{j} {path}")
