"""r_proc through the real OCR decoder path: `stages.codebook_models.LatentDecoder` over a micro `CodebookModel`
(and `rl.load_latent_decoder` reading one from a workdir), with the scripted copy evaluator of
tests/rewards/test_process.py.

An untrained micro decoder writes one repeated character whatever its codes, which can neither tell
a batching slip apart nor ever produce an answer. So the module first teaches the micro decoder (the
real network, teacher-forced, ~60 Adam steps on left-padded prefixes exactly as `greedy_decode`
masks them) to read a few code sequences of different lengths as known CoTs; every greedy decode is
still produced by the real `LatentDecoder`, never stubbed. A trained evaluator LM is out of reach in a
unit test, so the evaluator is scripted: it copies y_hat after `<answer>`, i.e. it answers y_hat's
last number. r_proc is then 1 exactly when the real decoder's text ends in the gold answer.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dlr_jax.config import load_config
from dlr_jax.core.sharding import make_mesh
from dlr_jax.data.formats import PROMPT_SEP, prompt_ids
from dlr_jax.generate.sampler import Sampler
from dlr_jax.models.codebook_model import CodebookModel, CodebookModelConfig, build_codebook_model, teacher_inputs
from dlr_jax.models.transformer import causal_mask, segment_positions
from dlr_jax.rewards.answer_format import RewardInputs, combine_rewards
from dlr_jax.rewards.process import LatentDecoder as LatentDecoderProtocol
from dlr_jax.rewards.process import ProcessReward
from dlr_jax.run.checkpoint import save_params
from dlr_jax.run.workdir import final_dir
from dlr_jax.stages.codebook.models import LatentDecoder
from dlr_jax.stages.rl import stage as rl
from dlr_jax.text.ocr_text import encode_target
from dlr_jax.text.tokens import train_bpe
from tests.micro import codebook_nets
from tests.rewards.test_process import QUESTION, CopyEvaluator, toy_boundary, toy_completions

ROOT = Path(__file__).resolve().parents[2]
K = 16
TEXT_LEN = 32
MICRO = [
    "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128", f"codebook.max_text_len={TEXT_LEN}",
    *codebook_nets(num_queries=8),
    f"latent.num_latents={K}", "latent.latent_dim=16", "mesh.fsdp=1", "codebook.eval_batch_size=4",
]
# Code sequences (1 to 8 codes) the micro decoder is taught to read, and their CoTs (final answer last).
TAUGHT: dict[tuple[int, ...], str] = {
    (1, 2, 3): "<<6*7=42>> 42",
    (4,): "<<5-2=3>> 3",
    (5, 6, 7, 8, 9): "<<2*9=18>> <<18+1=19>> 19",
    (0, 15): "<<8/4=2>> 2",
    (3,) * 8: "no numbers here",
}
UNTAUGHT = (2, 2)  # decodes to whatever the decoder makes of it


def _cfg():
    return load_config(ROOT / "configs" / "tiny.yaml", MICRO)


def _teach(model: CodebookModel, pairs: dict[tuple[int, ...], str], steps: int = 60) -> CodebookModel:
    """Fits the decoder side (prefix projection + decoder LM) to read each code sequence as its text."""
    p = max(map(len, pairs))
    codes = np.zeros((len(pairs), p), np.int32)
    real = np.zeros((len(pairs), p), bool)
    for r, z in enumerate(pairs):
        codes[r, p - len(z):], real[r, p - len(z):] = z, True  # left-padded, as LatentDecoder lays them out
    targets = jnp.asarray(np.stack([encode_target(t, TEXT_LEN)[0] for t in pairs.values()]))
    inputs, in_mask = teacher_inputs(targets)
    seg = jnp.concatenate([jnp.asarray(real), in_mask], axis=1).astype(jnp.int32)
    trainable = nnx.All(nnx.Param, nnx.Any(nnx.PathContains("decoder"), nnx.PathContains("prefix_proj")))
    graphdef, params, rest = nnx.split(model, trainable, ...)
    opt = optax.adam(1e-2)

    def loss(params):
        m = nnx.merge(graphdef, params, rest)
        x = jnp.concatenate([m.project(m.codes_to_features(jnp.asarray(codes))), m.decoder.embed_tokens(inputs)], 1)
        h, _ = m.decoder.trunk(x, segment_positions(seg), causal_mask(seg))
        ce = optax.softmax_cross_entropy_with_integer_labels(m.decoder.logits_from_hidden(h[:, p:]), targets)
        real_chars = targets != 0
        return jnp.sum(ce * real_chars) / jnp.sum(real_chars)

    @jax.jit
    def step(params, state):
        grads = jax.grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    state = opt.init(params)
    for _ in range(steps):
        params, state = step(params, state)
    return nnx.merge(graphdef, params, rest)


@pytest.fixture(scope="module")
def model():
    return _teach(build_codebook_model(CodebookModelConfig.from_config(_cfg()), seed=0), TAUGHT)


@pytest.fixture(scope="module")
def tok():
    texts = [QUESTION, *TAUGHT.values(), "How many pears does Tom have?"] * 20
    return train_bpe(texts, 300, num_latents=K, pad_multiple=64)


@pytest.fixture(scope="module")
def evaluator(tok):
    """The scripted evaluator's sampler, shared by every scorer below (one set of compiled functions)."""
    sep = tok.encode(PROMPT_SEP)
    assert len(sep) == 1
    return Sampler(CopyEvaluator(tok.text_vocab_size, sep[0], tok.answer_end_id), prompt_bucket=16)


def _scorer(decoder, evaluator, tok) -> ProcessReward:
    return ProcessReward(decoder, evaluator, tok, max_new_tokens=40, max_cot_tokens=64, batch_size=4)


def _prompts_seen(scorer: ProcessReward, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Records every prompt the scorer hands the evaluator (chunks flattened, padding repeats kept)."""
    seen: list[list[int]] = []
    generate = scorer.sampler.generate

    def recording(prompts, **kw):
        seen.extend(list(map(int, p)) for p in prompts)
        return generate(prompts, **kw)

    monkeypatch.setattr(scorer.sampler, "generate", recording)
    return seen


def test_the_micro_decoder_reads_its_taught_codes(model):
    dec = LatentDecoder(model, batch_size=8)
    assert isinstance(dec, LatentDecoderProtocol)
    got = dec.decode([list(z) for z in TAUGHT])
    assert got == list(TAUGHT.values()), "the micro decoder did not learn its code -> CoT table; tests below rely on it"


def test_evaluator_reads_exactly_the_real_decoding_at_any_decoder_batch_size(model, tok, evaluator):
    lat = tok.latent_id
    ls, le, a_s, a_e = tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id
    spans = list(TAUGHT)
    rows = [
        [ls, *map(lat, spans[0]), le, a_s, *tok.encode("5"), a_e],
        [ls, *map(lat, spans[1]), le, a_s, *tok.encode("3"), a_e],
        [ls, *map(lat, spans[2]), le],
        [ls, *map(lat, UNTAUGHT), le, a_s, *tok.encode("7"), a_e],
        [ls, le, a_s, *tok.encode("42"), a_e],  # empty span: not decoded, scores 0
        [a_s, *tok.encode("42"), a_e],          # no latent span at all: not decoded, scores 0
        [ls, *map(lat, spans[3]), le, a_s],
        [ls, *map(lat, spans[4]), le],
    ]
    codes = [spans[0], spans[1], spans[2], UNTAUGHT, spans[3], spans[4]]
    ids, mask = toy_completions(tok, rows)
    golds = ["42", "4", "19", "1", "42", "42", "2", "0"]
    inputs = RewardInputs(completions=[""] * len(rows), golds=golds, benchmark="gsm8k", completion_ids=ids,
                          completion_mask=mask, boundary=toy_boundary(tok), prompts=[QUESTION] * len(rows))
    # ground truth: each trace decoded alone, one sequence per call
    alone = LatentDecoder(model, batch_size=1)
    want_cots = [alone.decode([list(z)])[0] for z in codes]
    assert want_cots[:3] + want_cots[4:] == [TAUGHT[z] for z in codes if z != UNTAUGHT]
    want_prompts = [prompt_ids(tok, QUESTION) + tok.encode(c) + [a_s] for c in want_cots]

    results = {}
    for batch_size in (1, 4, 8):  # 4: two decode calls, each mixing prefix lengths (left padding)
        scorer = _scorer(LatentDecoder(model, batch_size=batch_size), evaluator, tok)
        with pytest.MonkeyPatch.context() as mp:
            seen = _prompts_seen(scorer, mp)
            reward = scorer(inputs)
        assert reward.shape == (len(rows),) and reward.dtype == np.float32
        assert set(np.unique(reward).tolist()) <= {0.0, 1.0}
        assert len(seen) == 8 and seen[6:] == [seen[5]] * 2  # 6 traces in chunks of 4, the last padded
        assert seen[:6] == want_prompts, batch_size
        head = len(prompt_ids(tok, QUESTION))
        assert [tok.decode(p[head:-1]) for p in seen[:6]] == want_cots  # y_hat is the decoding, verbatim
        results[batch_size] = reward
    np.testing.assert_array_equal(results[1], results[4])
    np.testing.assert_array_equal(results[1], results[8])
    # The decoder's reading decides: "<<6*7=42>> 42" -> 1 although the policy answered 5; a taught CoT
    # ending in 3 vs gold 4 -> 0; the empty and missing spans -> 0 although the policy answered 42.
    # (Row 3's untaught reading is arbitrary text: only its {0, 1} range is checked above.)
    known = [0, 1, 2, 4, 5, 6, 7]
    np.testing.assert_array_equal(results[1][known], [1, 0, 1, 0, 0, 1, 0])


def test_known_correct_traces_score_one(model, tok, evaluator):
    """A trace the real decoder reads as a correct CoT scores 1, the same trace against another gold 0:
    the scripted evaluator answers the decoded CoT's last number, so r_proc follows the decoder."""
    scorer = _scorer(LatentDecoder(model, batch_size=4), evaluator, tok)
    traces = [list(z) for z in TAUGHT]
    finals = ["42", "3", "19", "2", None]  # the taught CoTs' last numbers ("no numbers here" has none)
    right = [f or "7" for f in finals]
    got = scorer.score([QUESTION] * 5, traces, right, "gsm8k")
    np.testing.assert_array_equal(got, [1, 1, 1, 1, 0])
    shifted = right[1:4] + right[:1] + ["0"]  # every gold moved to another trace
    np.testing.assert_array_equal(scorer.score([QUESTION] * 5, traces, shifted, "gsm8k"), np.zeros(5))
    # as a weighted part of the GRPO reward, next to R_ans, which reads the policy's own answer instead
    span = [tok.latent_start_id, *map(tok.latent_id, traces[0]), tok.latent_end_id]
    rows = [[*span, tok.answer_start_id, *tok.encode(a), tok.answer_end_id] for a in ("42", "41")]
    ids, mask = toy_completions(tok, rows)
    inputs = RewardInputs(completions=["<answer>42</answer>", "<answer>41</answer>"], golds=["42", "42"],
                          benchmark="gsm8k", completion_ids=ids, completion_mask=mask, boundary=toy_boundary(tok),
                          prompts=[QUESTION] * 2, extras={"process_reward": scorer})
    total, parts = combine_rewards(inputs, {"answer": 1.0, "process": 0.5})
    np.testing.assert_array_equal(parts["answer"], [1, 0])
    np.testing.assert_array_equal(parts["process"], [1, 1])  # same latent trace, so same r_proc
    np.testing.assert_allclose(total, [1.5, 0.5])


def test_rl_loads_the_codebook_stage_decoder(model, tmp_path):
    cfg = _cfg()
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert rl.load_latent_decoder(cfg, tmp_path, mesh) is None  # no codebook stage yet
    mcfg = CodebookModelConfig.from_config(cfg)
    save_params(model, final_dir(tmp_path, "codebook"), {"kind": "codebook", "model": mcfg.to_dict()})
    dec = rl.load_latent_decoder(cfg, tmp_path, mesh)
    assert isinstance(dec, LatentDecoder) and isinstance(dec, LatentDecoderProtocol)
    assert dec.batch_size == cfg.codebook.eval_batch_size
    # the taught weights came back (a fresh init would write one repeated character)
    assert dec.decode([list(z) for z in TAUGHT] + [[]]) == [*TAUGHT.values(), ""]
