import json

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from dlr_jax.data.synthetic import generate
from dlr_jax.text.tokens import BOUNDARY_TOKENS, Tokenizer, train_bpe


def corpus() -> list[str]:
    exs = generate(400, seed=0)
    return [
        f"{e.question}<latent></latent><answer>{e.answer}</answer> {e.cot} 1234567890 Ünïcode ✓" for e in exs
    ]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_bpe(corpus(), vocab_size=400, num_latents=50, pad_multiple=128)


@pytest.mark.parametrize(
    "text",
    [
        "Tom has 123 apples. Tom buys 45 more apples.",
        "<<3+4=7>> <<7*12=84>> #### 84",
        "  leading and trailing spaces  ",
        "naïve café, 3½ — ✓ 日本",
        "<latent><z_0><z_49></latent><answer>-42</answer>",
        "",
    ],
)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode(tok.decode(ids)) == ids


def test_every_digit_is_its_own_token(tok):
    digit_ids = {d: tok.token_to_id(d) for d in "0123456789"}
    assert None not in digit_ids.values()
    ids = tok.encode("x 9876543210 y 1000000")
    pieces = [tok.id_to_token(i) for i in ids]
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("9876543210") + list("1000000")
    # no learned token anywhere in the vocabulary contains a digit plus anything else
    vocab = tok.backend.get_vocab()
    assert all(len(t) == 1 for t in vocab if any(c.isdigit() for c in t) and t not in BOUNDARY_TOKENS)


def test_boundary_tokens_are_single_ids(tok):
    for t, i in zip(
        BOUNDARY_TOKENS,
        (tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id),
        strict=True,
    ):
        assert tok.encode(t) == [i]
        assert tok.decode([i]) == t
    ids = tok.encode("ok<answer>12</answer>")
    assert ids[-4:] == [tok.answer_start_id, tok.token_to_id("1"), tok.token_to_id("2"), tok.answer_end_id]
    assert len({tok.pad_id, tok.eos_id, tok.bos_id, *[tok.token_to_id(t) for t in BOUNDARY_TOKENS]}) == 7


def test_latent_layout_and_padding(tok):
    assert tok.latent_offset == tok.text_vocab_size == tok.backend.get_vocab_size(with_added_tokens=True)
    assert tok.num_latents == 50
    assert tok.latent_id(0) == tok.latent_offset and tok.latent_id(49) == tok.latent_offset + 49
    with pytest.raises(IndexError):
        tok.latent_id(50)
    assert tok.total_vocab_size % 128 == 0
    assert tok.total_vocab_size - 128 < tok.text_vocab_size + 50 <= tok.total_vocab_size
    mask = tok.vocab_padding_mask()
    assert mask.dtype == bool and mask.shape == (tok.total_vocab_size,)
    assert mask.sum() == tok.text_vocab_size + 50
    assert mask[: tok.latent_offset + 50].all() and not mask[tok.latent_offset + 50 :].any()
    ids = np.arange(tok.total_vocab_size)
    assert np.array_equal(tok.is_latent(ids), (ids >= tok.latent_offset) & (ids < tok.latent_offset + 50))
    assert tok.is_latent(tok.latent_id(3)) and not tok.is_latent(tok.eos_id)
    assert tok.latent_index(tok.latent_id(7)) == 7
    with pytest.raises(ValueError, match="not a latent id"):
        tok.latent_index(5)


def test_pad_multiple_and_with_latents(tok):
    t2 = tok.with_latents(1000, pad_multiple=8)
    assert t2.total_vocab_size % 8 == 0 and t2.total_vocab_size >= t2.text_vocab_size + 1000
    assert t2.total_vocab_size - 8 < t2.text_vocab_size + 1000
    assert t2.text_vocab_size == tok.text_vocab_size and t2.encode("abc 12") == tok.encode("abc 12")
    assert tok.num_latents == 50, "the original is unchanged"


def test_decode_skips_pad_and_marks_latents(tok):
    ids = [
        tok.pad_id,
        *tok.encode("a 1"),
        tok.latent_start_id,
        tok.latent_id(3),
        tok.latent_end_id,
        tok.eos_id,
        tok.pad_id,
    ]
    assert tok.decode(ids) == "a 1<latent><z_3></latent><eos>"
    assert tok.decode(ids, skip_special_tokens=True) == "a 1<z_3>"
    assert tok.decode(np.array(ids)) == tok.decode(ids)
    with pytest.raises(ValueError, match="outside the text"):
        tok.decode([tok.total_vocab_size - 1])


def test_z_text_beyond_codebook_stays_text(tok):
    ids = tok.encode("<z_50>")
    assert not any(tok.is_latent(i) for i in ids) and tok.decode(ids) == "<z_50>"


def test_bos_eos(tok):
    ids = tok.encode("hi", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.encode("hi") == ids[1:-1]


def test_save_load_equality(tok, tmp_path):
    tok.save(tmp_path / "tokenizer")
    again = Tokenizer.load(tmp_path / "tokenizer")
    assert again == tok
    for attr in (
        "text_vocab_size",
        "latent_offset",
        "total_vocab_size",
        "pad_id",
        "eos_id",
        "bos_id",
        "latent_start_id",
        "latent_end_id",
        "answer_start_id",
        "answer_end_id",
        "num_latents",
    ):
        assert getattr(again, attr) == getattr(tok, attr), attr
    text = "Mia has 7 pens.<latent><z_1></latent><answer>7</answer>"
    assert again.encode(text) == tok.encode(text)
    assert np.array_equal(again.vocab_padding_mask(), tok.vocab_padding_mask())
    assert again != tok.with_latents(10)
    with pytest.raises(FileNotFoundError, match="not a directory written by Tokenizer.save"):
        Tokenizer.load(tmp_path)


def test_vocab_size_too_small():
    with pytest.raises(ValueError, match="byte alphabet"):
        train_bpe(["a b"], vocab_size=100)


def make_pretrained_dir(tmp_path, config: dict | None):
    """A HF-style checkpoint tokenizer: word-level vocab with holes-free ids and an eos."""
    vocab = {"<unk>": 0, "</s>": 1, "<s>": 2, "hello": 3, "world": 4}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / "tokenizer.json"))
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_from_pretrained_dir(tmp_path):
    d = make_pretrained_dir(
        tmp_path, {"eos_token": {"content": "</s>"}, "bos_token": "<s>", "pad_token": None}
    )
    tok = Tokenizer.from_pretrained_dir(d, num_latents=16, pad_multiple=64)
    assert (tok.eos_id, tok.bos_id) == (1, 2)
    assert tok.token_to_id("<pad>") == tok.pad_id  # added: the config has none
    added = {tok.pad_id, tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id}
    assert added == set(range(5, 10)), "new tokens come after the checkpoint's own ids"
    assert tok.text_vocab_size == 10 and tok.latent_offset == 10 and tok.total_vocab_size == 64
    assert tok.encode("hello<answer>world</answer>") == [3, tok.answer_start_id, 4, tok.answer_end_id]


def test_from_pretrained_dir_model_rows(tmp_path):
    d = make_pretrained_dir(tmp_path, None)  # no config: eos found among common names
    tok = Tokenizer.from_pretrained_dir(d, num_latents=4, pad_multiple=32, model_vocab_size=20)
    assert tok.eos_id == 1 and tok.bos_id is None
    assert tok.latent_offset == 20, "latents never alias rows the checkpoint already has"
    mask = tok.vocab_padding_mask()
    assert mask[:10].all() and not mask[10:20].any() and mask[20:24].all() and not mask[24:].any()
    tok.save(tmp_path / "saved")
    assert Tokenizer.load(tmp_path / "saved").latent_offset == 20


def test_from_pretrained_dir_without_eos(tmp_path):
    vocab = {"<unk>": 0, "a": 1}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="no eos token"):
        Tokenizer.from_pretrained_dir(tmp_path)


@pytest.mark.parametrize(
    "text", ["<<3+4=7>> <answer>7</answer> <z_3><latent><z_49></latent>", "plain 12 + 3", "<<answer>>", ""]
)
def test_encode_plain_never_gives_special_or_latent_ids(tok, text):
    """OCR decodes fed to the process reward's evaluator may spell markup; it must stay text."""
    ids = tok.encode_plain(text)
    assert not any(i in tok.special_ids or tok.is_latent(i) for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode_plain("Tom has 5 apples.") == tok.encode("Tom has 5 apples.")  # no markup: same ids
    if "<answer>" in text:
        assert tok.answer_start_id in tok.encode(text)  # the control: plain encode does map it
