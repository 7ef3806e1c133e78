"""The latent curriculum (data/curriculum.py): mixed rows, the schedules, and the sft pipeline that follows them."""

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from dlr_jax.data import formats
from dlr_jax.data.curriculum import Curriculum, split_cot
from dlr_jax.data.items import Item, build_sequence, filter_by_length
from dlr_jax.data.latents import LatentTable, step_result_latents
from dlr_jax.data.ocr_rows import ocr_fields
from dlr_jax.data.pipeline import make_stage_dataset
from dlr_jax.data.synthetic import generate
from dlr_jax.rewards.answer_format import format_reward
from dlr_jax.text.ocr_text import VOCAB, encode_target
from dlr_jax.text.tokens import Tokenizer, train_bpe

# A word-level tokenizer whose ids can be written out: the words 0..11, then <pad> 12, <latent> 13,
# </latent> 14, <answer> 15, </answer> 16 (added by Tokenizer), latent code c = id 17 + c.
WORDS = ["<unk>", "<eos>", "<bos>", "Q", "A", "b", ".", "C", "d", "E", "f", "7"]
COT = "A b. C d. E f."  # three steps: "A b." "C d." "E f."
CODES, STEPS = (3, 1, 4, 1, 5), (2, 1, 2)  # the span's codes, 2 + 1 + 2 of them per step


@pytest.fixture(scope="module")
def word_tok() -> Tokenizer:
    backend = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = Tokenizer(backend, bos_token="<bos>", eos_token="<eos>", num_latents=8, pad_multiple=1)
    assert (tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id) == (13, 14, 15, 16)
    assert tok.latent_offset == 17
    return tok


def _row(tok, k):
    latent = CODES[: sum(STEPS[:k])]
    _, text = split_cot(COT, len(STEPS), k)
    return formats.mixed_sequence(tok, "Q", latent, text, "7")


@pytest.mark.parametrize("k, want", [
    (0, [2, 3, 13, 14, 4, 5, 6, 7, 8, 6, 9, 10, 6, 15, 11, 16, 1]),  # empty span, then the whole CoT
    (1, [2, 3, 13, 20, 18, 14, 7, 8, 6, 9, 10, 6, 15, 11, 16, 1]),  # step 1's two codes, steps 2-3 as text
    (2, [2, 3, 13, 20, 18, 21, 14, 9, 10, 6, 15, 11, 16, 1]),
    (3, [2, 3, 13, 20, 18, 21, 18, 22, 14, 15, 11, 16, 1]),  # every step latent: the paper's row
])
def test_mixed_rows_written_out(word_tok, k, want):
    seq = _row(word_tok, k)
    assert seq.tokens.tolist() == want
    assert seq.loss_mask.tolist() == [0, 0] + [1] * (len(want) - 2)  # loss after x = [<bos> Q]


def test_edges_are_the_text_and_the_paper_rows(word_tok):
    assert _row(word_tok, 3).tokens.tolist() == formats.sft_sequence(word_tok, "Q", CODES, "7").tokens.tolist()
    text = formats.textsft_sequence(word_tok, "Q", COT, "7").tokens.tolist()
    assert _row(word_tok, 0).tokens.tolist() == text[:2] + [13, 14] + text[2:]
    # a whole-chain span (render_unit chain) is one step: k = 0 the text CoT, k = 1 the paper's row
    assert split_cot(COT, 1, 0) == ("", COT) and split_cot(COT, 1, 1) == (COT, "")
    assert split_cot(COT, 3, 1) == ("A b.", "C d. E f.")
    with pytest.raises(ValueError, match="example 'x/1'.*2 steps but .*finds 3"):
        split_cot(COT, 2, 1, example_id="x/1")


def test_parser_and_format_reward_read_mixed_generations(word_tok):
    bd = dict(latent_start_id=13, latent_end_id=14, answer_start_id=15, answer_end_id=16, is_latent=(17, 8))
    for k in (0, 1, 3):
        gen = _row(word_tok, k).tokens[2:]  # what the model writes after the prompt
        parsed = formats.parse_generation(word_tok, gen)
        assert parsed.answer_text == "7" and parsed.codes == list(CODES[: sum(STEPS[:k])])
        assert ("E f" in parsed.text) == (k < 3)
        assert format_reward(gen, **bd) == 1.0
    assert format_reward(_row(word_tok, 0).tokens[2:], min_latents=1, **bd) == 0.0


def test_stagewise_boundaries():
    cur = Curriculum("stagewise", stage_fraction=0.25).with_schedule(num_steps=100, examples_per_step=4)
    k = [[cur.latent_steps(p, "e", s, epoch_size=10) for s in (1, 5)] for p in (0, 99, 100, 199, 200, 299, 300, 399)]
    # 25 steps of 4 examples a stage; the last stage (the 4th) is all latent whatever S
    assert k == [[0, 0], [0, 0], [1, 1], [1, 1], [1, 2], [1, 2], [1, 5], [1, 5]]
    k_min = Curriculum("stagewise", 0.25, k_min=2).with_schedule(100, 4)
    assert [k_min.latent_steps(p, "e", s, epoch_size=10) for p, s in ((0, 5), (0, 1), (250, 5))] == [2, 1, 2]
    with pytest.raises(ValueError, match="with_schedule"):
        Curriculum("stagewise").latent_steps(0, "e", 3, epoch_size=10)


def test_random_draw_is_a_pure_function_covering_k_min_to_s():
    cur = Curriculum("random", seed=7)
    ids = [f"ex/{i}" for i in range(200)]
    draws = [cur.latent_steps(i, e, 4, epoch_size=200) for i, e in enumerate(ids)]
    assert draws == [Curriculum("random", seed=7).latent_steps(i, e, 4, epoch_size=200) for i, e in enumerate(ids)]
    assert set(draws) == {0, 1, 2, 3, 4}
    # one draw per (example, epoch): the position inside an epoch does not matter, the epoch does
    assert draws[:50] == [cur.latent_steps(150, e, 4, epoch_size=200) for e in ids[:50]]
    assert draws != [cur.latent_steps(200 + i, e, 4, epoch_size=200) for i, e in enumerate(ids)]
    assert draws != [Curriculum("random", seed=8).latent_steps(i, e, 4, epoch_size=200) for i, e in enumerate(ids)]
    high = {Curriculum("random", k_min=3).latent_steps(i, e, 4, epoch_size=200) for i, e in enumerate(ids)}
    assert high == {3, 4}


# ---- the pipeline ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synth():
    examples = generate(40, seed=0)
    texts = [f"{e.question}\n{e.cot}<answer>{e.answer}</answer>" for e in generate(300, seed=1)]
    tok = train_bpe(texts, vocab_size=320, num_latents=200)
    codes = step_result_latents(examples, 200)  # one code per calculator step: S = the CoT's steps
    table = LatentTable(dict(codes.items()), num_codes=200, steps={k: (1,) * len(v) for k, v in codes.items()})
    return examples, tok, table


def _kw(table, **kw):
    return dict(batch_size=4, max_len=96, seed=0, latents=table, num_threads=0) | kw


def _variants(examples, tok, table):
    """Every row any k gives any example -> (example id, k)."""
    out = {}
    for ex in examples:
        s = len(table.step_counts(ex.id))
        for k in range(s + 1):
            seq = build_sequence("sft", tok, Item(ex, table[ex.id], table.step_counts(ex.id), k))
            out[tuple(seq.tokens.tolist())] = (ex.id, k, s)
    return out


def _rows(batch):
    """The sequences of a batch, one per segment of each row."""
    return [tuple(row[segs == s].tolist()) for row, segs in zip(batch["tokens"], batch["segment_ids"], strict=True)
            for s in range(1, segs.max() + 1)]


def test_stagewise_pipeline_rows_follow_the_stages(synth):
    examples, tok, table = synth
    data = make_stage_dataset("sft", examples, tok, curriculum=Curriculum("stagewise", 0.25), **_kw(table))
    with pytest.raises(ValueError, match="schedule_curriculum"):
        iter(data)
    variants = _variants(examples, tok, table)
    it = iter(data.schedule_curriculum(8))  # 4 stages of 2 steps
    for step in range(8):
        for row in _rows(next(it)):
            _, k, s = variants[row]
            assert k == (s if step >= 6 else min(step // 2, s)), (step, k, s)


def test_random_pipeline_mixes_rows_and_resumes_bit_exact(synth):
    examples, tok, table = synth
    cur = Curriculum("random", seed=1)
    make = lambda: make_stage_dataset("sft", examples, tok, curriculum=cur, **_kw(table))  # noqa: E731
    full = [next(it) for it in [iter(make())] for _ in range(6)]  # past one epoch (17 examples fit)
    variants = _variants(examples, tok, table)
    ks = [variants[row][1:] for b in full for row in _rows(b)]
    assert {k for k, s in ks if s > 1} >= {0, 1, 2} and any(k == s for k, s in ks)
    first = iter(make())
    for _ in range(2):
        next(first)
    resumed = iter(make())
    resumed.set_state(first.get_state())
    for want in full[2:]:
        got = next(resumed)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_packed_rows_and_resume(synth):
    examples, tok, table = synth
    make = lambda: make_stage_dataset("sft", examples, tok, pack=True,  # noqa: E731
                                      curriculum=Curriculum("random", seed=1), **_kw(table, max_len=192))
    a = iter(make())
    first = [next(a) for _ in range(2)]
    assert first[0]["segment_ids"].max() > 1  # several mixed rows share a packed row
    variants = _variants(examples, tok, table)
    assert len({variants[row][1] for b in first for row in _rows(b)}) > 1
    state = a.get_state()
    want = next(a)
    b = iter(make())
    b.set_state(state)
    got = next(b)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_length_filter_fits_the_longest_variant(synth):
    examples, tok, table = synth
    ex = max(examples, key=lambda e: len(table.step_counts(e.id)))
    paper = len(build_sequence("sft", tok, Item(ex, table[ex.id])))
    kept, dropped = filter_by_length("sft", [ex], tok, max_len=paper, latents=table)
    assert (len(kept), dropped) == (1, 0)
    for cur in (Curriculum("random"), Curriculum("stagewise")):
        kept, dropped = filter_by_length("sft", [ex], tok, max_len=paper, latents=table, curriculum=cur)
        assert (len(kept), dropped) == (0, 1)  # its k = 0 row (the text CoT) is longer than the paper's


def test_ocr_targets_cover_the_latent_steps_only():
    ex = generate(40, seed=0)[1]  # '<<10+9=19>> <<19-3=16>> <<16*6=96>>'
    item = Item(ex, (19, 16, 96), (1, 1, 1))
    row = ocr_fields(item._replace(k=2), text_len=32, num_codes=4)
    assert row["ocr_codes"].tolist() == [0, 0, 19, 16] and row["ocr_code_mask"].tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(row["ocr_targets"], encode_target("<<10+9=19>> <<19-3=16>>", 32)[0])
    full = ocr_fields(item._replace(k=3), text_len=32, num_codes=4)
    np.testing.assert_array_equal(full["ocr_targets"], ocr_fields(item, text_len=32, num_codes=4)["ocr_targets"])
    none = ocr_fields(item._replace(k=0), text_len=32, num_codes=4)
    assert (none["ocr_targets"] == VOCAB.PAD).all()  # no latent step: the row adds no OCR loss
    assert none["ocr_code_mask"].sum() == 3
