"""The grammar's forced tokens: what RL must not credit to the policy."""

import numpy as np
import pytest

from dlr_jax.generate.latent_grammar import eval_vocab_mask, forced_tokens, latent_processor_aux
from dlr_jax.text.tokens import train_bpe

K = 8


@pytest.fixture(scope="module")
def tok():
    return train_bpe(["what is 2 + 3 ? the answer is 5 .", "12 * 4 = 48"] * 20, 280, num_latents=K, pad_multiple=64)


def _row(tok, *parts):
    return [t for p in parts for t in (p if isinstance(p, list) else [p])]


@pytest.mark.parametrize("constrain", [False, True])
def test_forced_tokens_are_the_cap_close_and_the_grammar_open(tok, constrain):
    five = tok.encode_plain("5")
    capped = _row(tok, tok.latent_start_id, tok.latent_id(1), tok.latent_id(2), tok.latent_end_id,
                  tok.answer_start_id, five, tok.answer_end_id)
    early = _row(tok, tok.latent_start_id, tok.latent_id(3), tok.latent_end_id, tok.answer_start_id, five,
                 tok.answer_end_id)
    n = max(len(capped), len(early)) + 2
    tokens = np.full((2, n), tok.pad_id, np.int32)
    tokens[0, : len(capped)], tokens[1, : len(early)] = capped, early
    lengths = np.asarray([len(capped), len(early)], np.int32)
    aux = latent_processor_aux(tok, limit=2, constrain=constrain)
    vm = eval_vocab_mask(tok, tok.total_vocab_size, "latent", constrain)
    forced = np.asarray(forced_tokens(tokens, lengths, aux, vm))
    # row 0 reached the cap of 2 latents: its `</latent>` was forced; row 1 closed its span itself
    expect = np.zeros((2, n), bool)
    expect[0, 3] = True
    if constrain:  # the grammar also leaves `<latent>` as the only first token
        expect[:, 0] = True
    np.testing.assert_array_equal(forced, expect)
