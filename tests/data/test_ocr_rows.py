"""Stage sft's dual branch under a step codebook (`ocr_unit="step"`, codebook.render_unit=step; data/pipeline.py):
a row's OCR target is one latent step, its codes -> its text, as the codebook's decoder was trained."""

import numpy as np
import pytest

from dlr_jax.data.cot_view import step_views
from dlr_jax.data.curriculum import Curriculum, ocr_step
from dlr_jax.data.items import Item, build_sequence
from dlr_jax.data.latents import LatentTable, random_latents
from dlr_jax.data.ocr_rows import ocr_fields
from dlr_jax.data.pipeline import make_stage_dataset
from dlr_jax.data.synthetic import generate
from dlr_jax.text.ocr_text import VOCAB, encode_target
from dlr_jax.text.steps import split_steps
from dlr_jax.text.tokens import train_bpe

EX = generate(40, seed=0)[1]  # synthetic/0/1: '<<10+9=19>> <<19-3=16>> <<16*6=96>>'
CODES, STEPS = (3, 1, 4, 1, 5, 9), (2, 2, 2)  # two codes a step
K = 256


def test_the_drawn_step_is_pinned_and_uniform():
    assert EX.id == "synthetic/0/1" and split_steps(EX.cot) == ["<<10+9=19>>", "<<19-3=16>>", "<<16*6=96>>"]
    # a stable hash of (seed, id, epoch): every process and grain worker draws the same step, a new one an epoch
    assert [ocr_step(0, EX.id, e, 3) for e in range(6)] == [2, 0, 0, 2, 2, 1]
    assert [ocr_step(1, EX.id, e, 3) for e in range(6)] == [0, 1, 0, 1, 2, 0]
    assert ocr_step(0, EX.id, 0, 0) is None and ocr_step(0, EX.id, 0, 1) == 0
    counts = np.bincount([ocr_step(0, f"e/{i}", 0, 4) for i in range(800)], minlength=4)
    assert counts.min() > 150, counts  # uniform over the latent steps: an unbiased sample of the per-step loss


def test_one_step_a_row_written_out():
    item = Item(EX, CODES, STEPS, ocr_step=1)
    row = ocr_fields(item, text_len=16, num_codes=4, unit="step")
    assert row["ocr_codes"].tolist() == [0, 0, 4, 1] and row["ocr_code_mask"].tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(row["ocr_targets"], encode_target("<<19-3=16>>", 16)[0])
    viewed = ocr_fields(item, text_len=16, num_codes=4, view="results", unit="step")  # that step's result only
    np.testing.assert_array_equal(viewed["ocr_targets"], encode_target("16", 16)[0])
    # a curriculum row: the drawn step is one of its k latent steps; with k = 0 nothing is read back
    np.testing.assert_array_equal(ocr_fields(item._replace(k=2), text_len=16, num_codes=4, unit="step")["ocr_codes"],
                                  row["ocr_codes"])
    none = ocr_fields(item._replace(k=0, ocr_step=None), text_len=16, num_codes=4, unit="step")
    assert (none["ocr_targets"] == VOCAB.PAD).all() and none["ocr_codes"].tolist() == [0, 0, 3, 1]
    with pytest.raises(ValueError, match="OCR step 2 is not one of its 2 latent steps"):
        ocr_fields(item._replace(k=2, ocr_step=2), text_len=16, num_codes=4, unit="step")
    with pytest.raises(ValueError, match="no latent step drawn"):
        ocr_fields(item._replace(ocr_step=None), text_len=16, num_codes=4, unit="step")
    # render_unit chain: the whole span reads back as the whole CoT, the drawn step ignored
    chain = ocr_fields(item, text_len=48, num_codes=6)
    assert chain["ocr_codes"].tolist() == list(CODES)
    np.testing.assert_array_equal(chain["ocr_targets"], encode_target(EX.cot, 48)[0])


@pytest.fixture(scope="module")
def synth():
    examples = generate(24, seed=0)
    tok = train_bpe([f"{e.question}\n{e.cot}<answer>{e.answer}</answer>" for e in generate(200, seed=1)],
                    vocab_size=320, num_latents=K)
    # two codes a step, distinct for every (example, step): a row's codes name the step it reads
    latents, steps = {}, {}
    for n, ex in enumerate(examples):
        s = len(split_steps(ex.cot))
        latents[ex.id] = [8 * n + 2 * j + t for j in range(s) for t in (0, 1)]
        steps[ex.id] = [2] * s
    return examples, tok, LatentTable(latents, num_codes=K, steps=steps)


def _rows(ds, examples, tok, table):
    """(global stream position, example, row's OCR fields) for every row of a one-process dataset."""
    by_tokens = {tuple(build_sequence("sft", tok, Item(ex, table[ex.id])).tokens.tolist()): ex for ex in examples}
    out = []
    for b, batch in enumerate(ds):
        for r in range(batch["tokens"].shape[0]):
            ex = by_tokens.get(tuple(batch["tokens"][r][batch["segment_ids"][r] > 0].tolist()))
            out.append((b * batch["tokens"].shape[0] + r, ex, {k: batch[k][r] for k in batch if k.startswith("ocr")}))
    return out


def test_each_row_reads_its_drawn_step(synth):
    examples, tok, table = synth
    kw = dict(batch_size=4, max_len=96, seed=5, latents=table, num_threads=0, ocr_text_len=24, num_epochs=2)
    rows = _rows(make_stage_dataset("sft", examples, tok, ocr_unit="step", **kw), examples, tok, table)
    n_items = len(rows) // 2
    drawn = set()
    for p, ex, f in rows:
        s = len(table.step_counts(ex.id))
        j = ocr_step(5, ex.id, p // n_items, s)
        start = 8 * examples.index(ex) + 2 * j
        assert f["ocr_codes"].tolist() == [start, start + 1] and f["ocr_code_mask"].tolist() == [1, 1]  # N = 2
        np.testing.assert_array_equal(f["ocr_targets"], encode_target(step_views(ex.cot, "cot")[j], 24)[0])
        drawn.add(j)
    assert drawn >= {0, 1, 2}

    # chain: the rows are the paper's branch, whatever steps the latents file records
    chain = make_stage_dataset("sft", examples, tok, ocr_unit="chain", **kw)
    for (_, ex, f), plain in zip(_rows(chain, examples, tok, table),
                                 _rows(make_stage_dataset("sft", examples, tok, **kw), examples, tok, table),
                                 strict=True):
        n = len(table[ex.id])
        assert f["ocr_codes"].shape == (max(len(v) for v in table.values()),)
        assert f["ocr_codes"][-n:].tolist() == list(table[ex.id]) and f["ocr_code_mask"].sum() == n
        np.testing.assert_array_equal(f["ocr_targets"], encode_target(ex.cot, 24)[0])
        for k in f:
            np.testing.assert_array_equal(f[k], plain[2][k])


def test_curriculum_rows_read_one_of_their_latent_steps(synth):
    examples, tok, table = synth
    cur = Curriculum("random", seed=3)
    kw = dict(batch_size=4, max_len=128, seed=5, latents=table, num_threads=0, ocr_text_len=24, num_epochs=1)
    ds = make_stage_dataset("sft", examples, tok, ocr_unit="step", curriculum=cur, **kw)
    n_items = ds.examples
    ks = set()
    for b, batch in enumerate(ds):
        for r in range(batch["tokens"].shape[0]):
            p = b * 4 + r
            ex = next(e for e in examples if batch["ocr_codes"][r, -1] // 8 == examples.index(e))
            k = cur.latent_steps(p, ex.id, len(table.step_counts(ex.id)), epoch_size=n_items)
            ks.add(k)
            if k == 0:
                assert (batch["ocr_targets"][r] == VOCAB.PAD).all()
                continue
            j = ocr_step(5, ex.id, 0, k)
            start = 8 * examples.index(ex) + 2 * j
            assert batch["ocr_codes"][r].tolist() == [start, start + 1]
            np.testing.assert_array_equal(batch["ocr_targets"][r], encode_target(split_steps(ex.cot)[j], 24)[0])
    assert 0 in ks and len(ks) > 2


def test_latents_without_steps_are_refused(synth):
    examples, tok, _ = synth
    chain_export = random_latents(examples, K)  # no "steps": one step of all its codes
    with pytest.raises(ValueError, match="latent span has 1 steps but the codebook renders [2-9]"):
        make_stage_dataset("sft", examples, tok, batch_size=4, max_len=96, seed=0, latents=chain_export,
                           num_threads=0, ocr_text_len=24, ocr_unit="step")
