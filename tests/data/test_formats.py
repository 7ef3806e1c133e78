import numpy as np
import pytest

from dlr_jax.data import formats
from dlr_jax.data.synthetic import generate
from dlr_jax.text.tokens import Tokenizer, train_bpe

K = 50


@pytest.fixture(scope="module")
def examples():
    return generate(40, seed=0)


@pytest.fixture(scope="module")
def tok(examples) -> Tokenizer:
    texts = [f"{e.question}\n{e.cot}<answer>{e.answer}</answer>" for e in generate(300, seed=1)]
    return train_bpe(texts, vocab_size=320, num_latents=K)


@pytest.fixture(scope="module")
def tok_no_bos(tok) -> Tokenizer:
    # Qwen-style: no bos token (the backend still has "<bos>", the wrapper just never adds it).
    return Tokenizer(tok.backend, bos_token=None, num_latents=K)


def _mask_after(seq: formats.Sequence, start: int) -> None:
    expect = np.zeros(len(seq), np.int8)
    expect[start:] = 1
    np.testing.assert_array_equal(seq.loss_mask, expect)
    assert seq.tokens.dtype == np.int32 and seq.loss_mask.dtype == np.int8


def test_prompt_ids(tok, tok_no_bos, examples):
    for ex in examples[:5]:
        x = formats.prompt_ids(tok, "  " + ex.question + " ")
        assert x[0] == tok.bos_id
        assert x[-len(tok.encode("\n")) :] == tok.encode("\n")
        assert tok.decode(x) == f"<bos>{ex.question}\n"
        y = formats.prompt_ids(tok_no_bos, ex.question)
        assert tok.bos_id not in y and tok_no_bos.decode(y) == f"{ex.question}\n"


@pytest.mark.parametrize("mode", ["cot", "direct"])
def test_textsft_layout(tok, examples, mode):
    for ex in examples:
        seq = formats.textsft_sequence(tok, ex.question, ex.cot, ex.answer, mode)
        x = formats.prompt_ids(tok, ex.question)
        assert seq.tokens[: len(x)].tolist() == x
        y = ex.cot if mode == "cot" else ""
        assert tok.decode(seq.tokens) == f"<bos>{ex.question}\n{y}<answer>{ex.answer}</answer><eos>"
        _mask_after(seq, len(x))


def test_textsft_rejects_unknown_mode(tok, examples):
    ex = examples[0]
    with pytest.raises(ValueError, match="mode"):
        formats.textsft_sequence(tok, ex.question, ex.cot, ex.answer, "latent")


def test_align_layout_and_loss_covers_everything(tok, tok_no_bos, examples):
    for t, prefix in ((tok, "<bos>"), (tok_no_bos, "")):
        for i, ex in enumerate(examples[:10]):
            codes = [(7 * i + j) % K for j in range(4 + i % 6)]
            seq = formats.align_sequence(t, codes, ex.cot)
            z = "".join(f"<z_{k}>" for k in codes)
            assert t.decode(seq.tokens) == f"{prefix}{z}{ex.cot}<eos>"
            assert [int(v) for v in seq.tokens if t.is_latent(v)] == t.latent_ids(codes)
            # every position with a predecessor is a target; position 0 has none
            _mask_after(seq, 1)
    with pytest.raises(ValueError, match="at least one latent"):
        formats.align_sequence(tok, [], examples[0].cot)


def test_sft_layout(tok, examples):
    for i, ex in enumerate(examples):
        codes = [(3 * i + j) % K for j in range(4 if i % 2 else 9)]
        seq = formats.sft_sequence(tok, ex.question, codes, ex.answer)
        x = formats.prompt_ids(tok, ex.question)
        toks = seq.tokens.tolist()
        assert toks[: len(x)] == x
        _mask_after(seq, len(x))
        pos = [
            toks.index(b)
            for b in (
                tok.latent_start_id,
                tok.latent_end_id,
                tok.answer_start_id,
                tok.answer_end_id,
                tok.eos_id,
            )
        ]
        assert pos == sorted(pos) and pos[0] == len(x) and pos[-1] == len(toks) - 1
        assert toks[pos[0] + 1 : pos[1]] == tok.latent_ids(codes)
        assert pos[2] == pos[1] + 1  # </latent> is followed directly by <answer>
        assert tok.decode(toks[pos[2] + 1 : pos[3]]) == ex.answer  # answer encoded bare
        z = "".join(f"<z_{k}>" for k in codes)
        assert tok.decode(toks) == f"<bos>{ex.question}\n<latent>{z}</latent><answer>{ex.answer}</answer><eos>"


def test_first_position_is_never_a_target(tok, examples):
    ex = examples[0]
    for seq in (
        formats.textsft_sequence(tok, "", "", ex.answer),
        formats.align_sequence(tok, [1], ""),
        formats.sft_sequence(tok, ex.question, [1, 2], ex.answer),
    ):
        assert seq.loss_mask[0] == 0 and seq.num_targets == int(seq.loss_mask[1:].sum()) > 0


@pytest.mark.parametrize("answer", ["42", "-7", "3/4", "0.5", "\\frac{1}{2}"])
def test_parse_generation_round_trip(tok, examples, answer):
    ex = examples[3]
    codes = [5, 0, 49, 12, 5]
    seq = formats.sft_sequence(tok, ex.question, codes, answer)
    gen = seq.tokens[len(formats.prompt_ids(tok, ex.question)) :]
    # what a sampler returns: eos, then junk / padding after it
    gen = np.concatenate([gen, tok.encode(" <answer>99</answer>"), [tok.pad_id] * 3])
    p = formats.parse_generation(tok, gen)
    assert p.latent_ids == tok.latent_ids(codes) and p.codes == codes and p.n_latents == 5
    assert p.answer_text == answer
    assert p.text == f"<latent></latent><answer>{answer}</answer>"
    assert "<z_" not in p.text


def test_parse_generation_malformed(tok):
    lat = tok.latent_ids([1, 2, 3])
    # no answer at all: latents counted, answer None
    p = formats.parse_generation(tok, [tok.latent_start_id, *lat])
    assert (p.n_latents, p.answer_text) == (3, None)
    # forced latent phase (prompt ended with <latent>), unclosed answer span with a leading space
    ids = [*lat, tok.latent_end_id, tok.answer_start_id, *tok.encode(" 17 ")]
    p = formats.parse_generation(tok, np.asarray([ids]))
    assert (p.n_latents, p.answer_text) == (3, "17")
    # the last answer span wins
    ids = [tok.answer_start_id, *tok.encode("1"), tok.answer_end_id, tok.answer_start_id, *tok.encode("2")]
    ids += [tok.answer_end_id]
    assert formats.parse_generation(tok, ids).answer_text == "2"
    # empty generation
    p = formats.parse_generation(tok, [])
    assert (p.latent_ids, p.answer_text, p.text, p.n_latents) == ([], None, "", 0)
