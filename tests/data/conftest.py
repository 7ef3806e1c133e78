"""Fixtures `data.items` and `data.pipeline` tests share: unique synthetic examples, a small BPE tokenizer whose pad
id is neither 0 nor a base special id, and random latents for the examples."""

import pytest

from dlr_jax.data.latents import random_latents
from dlr_jax.data.synthetic import generate
from dlr_jax.text.tokens import Tokenizer, train_bpe

K = 64  # latent codebook size


@pytest.fixture(scope="module")
def examples():
    seen, out = set(), []
    for ex in generate(150, seed=0):  # unique questions, so sequences identify examples
        if ex.question not in seen:
            seen.add(ex.question)
            out.append(ex)
    return out


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    texts = [f"{e.question}\n{e.cot}<answer>{e.answer}</answer>" for e in generate(300, seed=1)]
    base = train_bpe(texts, vocab_size=320, num_latents=K)
    # a pad id other than 0 catches code that pads with zeros instead of tok.pad_id
    tok = Tokenizer(base.backend, pad_token="<|pad|>", bos_token="<bos>", num_latents=K)
    assert tok.pad_id not in (0, *base.special_ids)
    return tok


@pytest.fixture(scope="module")
def table(examples):
    return random_latents(examples, K, seed=0)
