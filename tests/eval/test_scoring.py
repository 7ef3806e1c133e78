"""The paper's reading of evaluation (issue 52): greedy dynamic decoding, answers from the <answer> span only
(the last-number fallback an option, counted), #L as the latents of the first span (CoT tokens for CoT-SFT); and
`python -m dlr_jax.evaluate` honouring each option."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlr_jax.config import Config, EvalConfig
from dlr_jax.data.formats import prompt_ids
from dlr_jax.data.records import Example
from dlr_jax.eval import cli as ev_cli
from dlr_jax.eval import evaluate as ev
from dlr_jax.eval.scoring import latent_span, read_answer, score_one
from dlr_jax.eval.stats import format_table
from dlr_jax.text.tokens import train_bpe
from tests.eval.test_evaluate import CORPUS, BigramLM, K, toy_examples


@pytest.fixture(scope="module")
def tok():
    return train_bpe(CORPUS, 300, num_latents=K, pad_multiple=64)  # test_evaluate's tokenizer


def _ex(gold: str) -> Example:
    return Example(id="t/0", question="What is 4 plus 3?", cot="", answer=gold, source="synthetic")


def _script(tok, path: list[int]) -> BigramLM:
    """A bigram model that follows `path` (each token once) from the prompt's last token, greedy or at T = 1."""
    assert len(set(path)) == len(path)
    v = tok.total_vocab_size
    t = np.zeros((v, v), np.float32)
    for a, b in zip([prompt_ids(tok, "x")[-1], *path[:-1]], path, strict=True):
        t[a, b] = 30.0
    return BigramLM(t)


def _text(tok, s: str) -> list[int]:
    return tok.encode(s)


# ---------------------------------------------------------------------------------------------
# Scoring one generation.


def test_a_mixed_generation_counts_the_first_span_and_reads_the_answer_span(tok):
    """`<latent> z z </latent> text <answer> a </answer>` (dynamic decoding, or a latent curriculum): #L is the
    span's 2 latents, the answer the span's, not the text's last number."""
    z = tok.latent_id
    gen = np.asarray([tok.latent_start_id, z(3), z(5), tok.latent_end_id, *_text(tok, "7 pears"),
                      tok.answer_start_id, *_text(tok, "42"), tok.answer_end_id, tok.eos_id])
    row = score_one(tok, _ex("42"), "synthetic", gen, True, 0, "latent")
    assert (row["L"], row["n_latents"], row["latent_codes"], row["latents_outside"]) == (2, 2, [3, 5], 0)
    assert row["answer"] == "42" and row["correct"] and not row["answer_fallback"] and row["format_ok"]
    # a latent id after the span is not reasoning in it: not counted, reported apart, and the format is broken
    stray = np.asarray([tok.latent_start_id, z(3), tok.latent_end_id, z(7), tok.answer_start_id,
                        *_text(tok, "42"), tok.answer_end_id])
    row = score_one(tok, _ex("42"), "synthetic", stray, True, 0, "latent")
    assert (row["L"], row["latents_outside"], row["latent_codes"], row["format_ok"]) == (1, 1, [3], False)
    # a span the budget cut off counts to the end; no <latent> at all counts nothing
    assert latent_span(tok, [tok.latent_start_id, z(1), z(2)]) == [z(1), z(2)]
    assert latent_span(tok, [z(1), *_text(tok, "42")]) == []


def test_cot_reasoning_length_on_a_mixed_generation_counts_the_tokens_before_the_answer(tok):
    gen = np.asarray([*_text(tok, "7 pears"), tok.answer_start_id, *_text(tok, "42"), tok.answer_end_id])
    row = score_one(tok, _ex("42"), "synthetic", gen, True, 0, "cot")
    assert row["L"] == 2 and row["n_latents"] == 0 and row["correct"] and "format_ok" not in row


def test_without_an_answer_span_the_fallback_off_gives_no_answer_and_last_number_reads_one(tok):
    gen = np.asarray([tok.latent_start_id, tok.latent_id(0), tok.latent_end_id, *_text(tok, "7 pears"), tok.eos_id])
    off = score_one(tok, _ex("7"), "synthetic", gen, True, 0, "latent")
    assert off["answer"] is None and not off["correct"] and not off["answer_fallback"]
    on = score_one(tok, _ex("7"), "synthetic", gen, True, 0, "latent", answer_fallback="last_number")
    assert on["answer"] == "7" and on["correct"] and on["answer_fallback"]
    # with a span the fallback never fires, whatever the setting
    assert read_answer("7 pears <answer>42</answer>", "last_number") == ("42", False)
    assert read_answer("<answer></answer> 7", "last_number") == (None, False)  # an empty span is no answer
    with pytest.raises(ValueError, match="answer_fallback must be one of"):
        read_answer("7", "last")


# ---------------------------------------------------------------------------------------------
# Evaluation with the paper's defaults and the options.


def test_greedy_dynamic_decoding_scores_the_span_after_an_early_close_and_text(tok):
    """The model closes its span after 1 latent (cap 6) and writes text before its answer; dynamic decoding
    leaves it so, and the answer is the span's."""
    path = [tok.latent_start_id, tok.latent_id(0), tok.latent_end_id, *_text(tok, "7 pears"), tok.answer_start_id,
            *_text(tok, "42"), tok.answer_end_id, tok.eos_id]
    cfg = EvalConfig(benchmarks=("synthetic",), batch_size=4, max_new_tokens=16, max_latents=6)
    assert (cfg.decoding, cfg.answer_fallback, cfg.temperature) == ("dynamic", "off", 0.0)  # the paper's reading
    res = ev.run_benchmarks(_script(tok, path), tok, cfg, loader=lambda name, split: toy_examples(3),
                            progress=False)
    m = res["benchmarks"]["synthetic"]
    assert (m["decoding"], m["answer_fallback"], m["answer_fallback_fired"]) == ("dynamic", "off", 0)
    assert m["pass_at_1"]["mean"] == 1.0 and m["L"]["mean"] == 1.0 and m["format_ok"]["mean"] == 1.0
    assert m["greedy_single_run"] and res["eval"]["decoding"] == "dynamic"
    assert any("dynamic decoding" in n for n in res["notes"])


def test_the_fallback_is_an_option_and_results_count_how_often_it_fired(tok):
    path = [tok.latent_start_id, tok.latent_id(0), tok.latent_end_id, *_text(tok, "7 pears"), tok.eos_id]
    model, golds = _script(tok, path), toy_examples(4, ["7"] * 4)
    kw = dict(loader=lambda name, split: golds, progress=False)
    cfg = EvalConfig(benchmarks=("synthetic",), batch_size=4, max_new_tokens=16, max_latents=6)
    off = ev.run_benchmarks(model, tok, cfg, **kw)["benchmarks"]["synthetic"]
    assert off["pass_at_1"]["mean"] == 0.0 and off["answer_fallback_fired"] == 0
    on = ev.run_benchmarks(model, tok, EvalConfig(**{**cfg.__dict__, "answer_fallback": "last_number"}), **kw)
    m = on["benchmarks"]["synthetic"]
    assert m["pass_at_1"]["mean"] == 1.0 and m["answer_fallback_fired"] == 4
    assert m["answer_fallback_rate"]["mean"] == 1.0 and m["answer_fallback"] == "last_number"
    assert "the answer fallback (last_number) gave 4 of 4 answers" in format_table(on)
    assert "fallback" not in format_table({"benchmarks": {"synthetic": off}}).split("\n", 2)[-1]


def test_evaluate_cli_honours_decoding_fallback_and_temperature(tok, tmp_path, monkeypatch):
    """The model answers in text at once ("7 pears", no span): dynamic decoding leaves it, the grammar makes it
    open a latent span first; the fallback reads the 7; a temperature samples every seed."""
    model = _script(tok, [*_text(tok, "7 pears"), tok.eos_id])
    cfg = Config(eval=EvalConfig(benchmarks=("synthetic",), batch_size=4, max_new_tokens=12, max_latents=4))
    monkeypatch.setattr(ev, "load_stage_model", lambda w, s, *, mesh=None: (model, tok, cfg))
    monkeypatch.setattr(ev, "default_loader", lambda data_dir=None: lambda name, split: toy_examples(2, ["7", "7"]))

    def run(*flags: str) -> tuple[dict, list[dict]]:
        res = ev_cli.main(["--workdir", str(tmp_path), "--stage", "sft", "--benchmarks", "gsm8k", "--no-progress",
                           *flags])
        rows = [json.loads(line) for line in (tmp_path / "sft/eval/samples.jsonl").read_text().splitlines()]
        return res, rows

    res, rows = run()  # the workdir's config: the paper's reading
    assert res["eval"]["decoding"] == "dynamic" and res["eval"]["answer_fallback"] == "off"
    assert all(r["prediction"] == "7 pears" and r["answer"] is None and r["L"] == 0 for r in rows)
    res, rows = run("--answer-fallback", "last_number")
    assert res["benchmarks"]["gsm8k"]["answer_fallback_fired"] == 2 and all(r["correct"] for r in rows)
    res, rows = run("--set", "eval.answer_fallback=last_number", "--decoding", "constrained")
    assert res["eval"]["decoding"] == "constrained" and res["eval"]["answer_fallback"] == "last_number"
    assert all(r["prediction"].startswith("<latent>") for r in rows)
    res, _ = run("--no-constrain-format", "--temperature", "1.0", "--seeds", "2")
    m = res["benchmarks"]["gsm8k"]
    assert m["decoding"] == "dynamic" and m["temperature"] == 1.0 and m["seeds"] == [0, 1]
    assert not m["greedy_single_run"]
    with pytest.raises(SystemExit):  # argparse refuses a reading that does not exist
        ev_cli.build_parser().parse_args(["--stage", "sft", "--decoding", "free"])
