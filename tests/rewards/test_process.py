"""r_proc end to end with toy models: latent codes -> decoder text -> evaluator answer -> is_correct."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.data.formats import PROMPT_SEP, prompt_ids
from dlr_jax.rewards.answer_format import BoundaryIds, RewardInputs, combine_rewards, get_reward
from dlr_jax.rewards.process import LatentDecoder, ProcessReward, well_formed_codes
from dlr_jax.text.tokens import train_bpe

QUESTION = "Tom has 6 bags of 7 apples. How many apples?"


@pytest.fixture(scope="module")
def tok():
    texts = [QUESTION, "<<6*7=42>> 42", "<<3+4=7>> 7 apples", "How many pears does Tom have?"] * 20
    return train_bpe(texts, 300, num_latents=16, pad_multiple=64)


class CopyEvaluator(nnx.Module):
    """Toy evaluator LM with the sampler's cache interface: after `<answer>` it writes back, token by
    token, whatever stood between the prompt separator and `<answer>` (i.e. y_hat), then `</answer>`.
    Its answer is therefore the last number of the decoded CoT, so tests control it exactly."""

    def __init__(self, vocab: int, sep_id: int, answer_end_id: int):
        self.scale = nnx.Param(jnp.float32(10.0))
        self.vocab, self.sep_id, self.answer_end_id = vocab, sep_id, answer_end_id

    def init_cache(self, batch: int, max_len: int) -> dict:
        z = jnp.zeros((batch,), jnp.int32)
        return {"mem": jnp.zeros((batch, max_len), jnp.int32), "ptr": z, "end": z}

    def forward_cached(self, input_ids, positions, token_mask, cache):
        b, t = input_ids.shape
        if t > 1:  # prefill: remember the prompt; y_hat runs from after the last separator to <answer>
            mem = cache["mem"].at[:, :t].set(input_ids)
            last_sep = jnp.max(jnp.where(input_ids == self.sep_id, jnp.arange(t)[None, :], -1), axis=1)
            ptr, end = last_sep + 1, jnp.full((b,), t - 1, jnp.int32)
        else:
            mem, ptr, end = cache["mem"], cache["ptr"], cache["end"]
        nxt = jnp.where(ptr < end, mem[jnp.arange(b), jnp.minimum(ptr, mem.shape[1] - 1)], self.answer_end_id)
        logits = jax.nn.one_hot(nxt, self.vocab) * self.scale[...]
        return jnp.repeat(logits[:, None], t, axis=1), {"mem": mem, "ptr": ptr + 1, "end": end}


class SumDecoder:
    """Toy OCR decoder: codes [a, b, ...] -> "<<a+b+...=s>> s"; records what it was asked."""

    def __init__(self):
        self.calls: list[list[list[int]]] = []

    def decode(self, codes: list[list[int]]) -> list[str]:
        self.calls.append(codes)
        return [f"<<{'+'.join(map(str, c))}={sum(c)}>> {sum(c)}" for c in codes]


def toy_boundary(tok) -> BoundaryIds:
    return BoundaryIds(tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id,
                       tok.latent_offset, tok.num_latents)


def toy_completions(tok, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, rows))
    ids = np.full((len(rows), width), tok.pad_id, np.int32)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return ids, mask


@pytest.fixture(scope="module")
def scorer(tok):
    sep = tok.encode(PROMPT_SEP)
    assert len(sep) == 1
    evaluator = CopyEvaluator(tok.text_vocab_size, sep[0], tok.answer_end_id)
    return ProcessReward(SumDecoder(), evaluator, tok, max_new_tokens=24, batch_size=2, prompt_bucket=16)


def test_toy_decoder_satisfies_protocol():
    assert isinstance(SumDecoder(), LatentDecoder)
    with pytest.raises(TypeError, match="no decode"):
        ProcessReward(object(), None, None)


def test_evaluator_prompt_is_the_textsft_cot_format(tok, scorer):
    cot = "<<6*7=42>> 42"
    p = scorer.evaluator_prompt(QUESTION, cot)
    assert p == prompt_ids(tok, QUESTION) + tok.encode(cot) + [tok.answer_start_id]
    short = ProcessReward(SumDecoder(), scorer.sampler, tok, max_cot_tokens=3)
    assert short.evaluator_prompt(QUESTION, cot) == prompt_ids(tok, QUESTION) + tok.encode(cot)[:3] + [
        tok.answer_start_id
    ]
    # markup spelled by an OCR decode stays text: only the final <answer> is the boundary id
    odd = "<<6*7=42>> <answer>41</answer> <z_1>"
    p = scorer.evaluator_prompt(QUESTION, odd)
    body = p[len(prompt_ids(tok, QUESTION)):-1]
    assert p[-1] == tok.answer_start_id and tok.decode(body) == odd
    assert not any(i in tok.special_ids or tok.is_latent(i) for i in body)


def test_known_correct_trace_scores_one(tok, scorer):
    # The evaluator copies y_hat after <answer>, so is_correct reads y_hat's last number: 42 for
    # codes [15, 15, 12].
    assert scorer.answers([QUESTION, QUESTION], ["<<6*7=42>> 42", "7"]) == ["<<6*7=42>> 42", "7"]
    got = scorer.score([QUESTION] * 2, [[15, 15, 12], [15, 15, 12]], ["42", "41"], "gsm8k")
    np.testing.assert_array_equal(got, [1.0, 0.0])


def test_decoder_output_feeds_the_evaluator(tok, scorer):
    lat = tok.latent_id
    ls, le, a_s, a_e = tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id
    rows = [
        [ls, lat(9), lat(3), le, a_s, *tok.encode("5"), a_e],  # 9+3=12: right process, wrong answer
        [ls, lat(1), lat(2), le, a_s, *tok.encode("12"), a_e],  # 1+2=3: wrong process, right answer
        [ls, lat(9), lat(3), a_s],                              # span never closed
        [ls, le, a_s, a_e],                                     # empty span
        [a_s, *tok.encode("12"), a_e],                          # no latent span at all
        [ls, lat(12), le],                                      # 12
    ]
    ids, mask = toy_completions(tok, rows)
    dec = scorer.decoder
    dec.calls.clear()
    inputs = RewardInputs(completions=[""] * 6, golds=["12"] * 6, benchmark="gsm8k", completion_ids=ids,
                          completion_mask=mask, boundary=toy_boundary(tok), prompts=[QUESTION] * 6,
                          extras={"process_reward": scorer})
    before = scorer.sampler.cache_size()["decode"]
    total, parts = combine_rewards(inputs, {"process": 0.25})
    np.testing.assert_array_equal(parts["process"], [1, 0, 0, 0, 0, 1])
    np.testing.assert_allclose(total, 0.25 * parts["process"])
    # One batched decode call with only the well-formed traces; the evaluator ran in fixed chunks of 2
    # (3 rows -> 2 chunks, one compiled decode loop).
    assert dec.calls == [[[9, 3], [1, 2], [12]]]
    assert scorer.sampler.cache_size()["decode"] - before <= 1
    np.testing.assert_array_equal(get_reward("process")(inputs), parts["process"])


def test_well_formed_codes_and_clear_errors(tok):
    lat, ls, le = tok.latent_id, tok.latent_start_id, tok.latent_end_id
    ids, mask = toy_completions(tok, [[ls, lat(4), le], [ls, lat(4)], [lat(4), le], [ls, lat(5), lat(6), le, lat(7)]])
    assert well_formed_codes(ids, mask, toy_boundary(tok)) == [[4], None, None, [5, 6]]
    inputs = RewardInputs(completions=[""], golds=["1"], benchmark="gsm8k", completion_ids=ids[:1],
                          completion_mask=mask[:1], boundary=toy_boundary(tok), prompts=[QUESTION])
    with pytest.raises(ValueError, match="extras\\['process_reward'\\]"):
        get_reward("process")(inputs)


def test_a_step_codebook_reads_the_span_one_step_at_a_time(tok, scorer):
    # codebook.render_unit=step on a fixed canvas: every step has c codes; y_hat is the decoded steps joined
    span = [1, 2, 3, 4, 5]
    chain = ProcessReward(SumDecoder(), scorer.sampler, tok, max_new_tokens=40, batch_size=2)
    c1 = ProcessReward(SumDecoder(), scorer.sampler, tok, max_new_tokens=40, batch_size=2, step_codes=1)
    c4 = ProcessReward(SumDecoder(), scorer.sampler, tok, max_new_tokens=40, batch_size=2, step_codes=4)
    assert chain.read([span]) == ["<<1+2+3+4+5=15>> 15"]
    assert c1.read([span, [7]]) == ["<<1=1>> 1 <<2=2>> 2 <<3=3>> 3 <<4=4>> 4 <<5=5>> 5", "<<7=7>> 7"]
    assert c4.read([span, [6, 6, 6, 6]]) == ["<<1+2+3+4=10>> 10 <<5=5>> 5", "<<6+6+6+6=24>> 24"]
    assert c4.decoder.calls == [[[1, 2, 3, 4], [5], [6, 6, 6, 6]]]  # one batched decode over every step
    # that y_hat is what the evaluator reads: its answer is the last step's number, not the span's sum
    np.testing.assert_array_equal(c4.score([QUESTION] * 2, [span, span], ["5", "15"], "gsm8k"), [1.0, 0.0])
    np.testing.assert_array_equal(chain.score([QUESTION] * 2, [span, span], ["5", "15"], "gsm8k"), [0.0, 1.0])
    with pytest.raises(ValueError, match="step_codes must be >= 1"):
        ProcessReward(SumDecoder(), scorer.sampler, tok, step_codes=0)
