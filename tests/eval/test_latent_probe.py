"""The latent probe: gold / shuffled / generated spans through the evaluation code, latent match, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.eval import latent_probe as lp
from tests.eval.test_evaluate import BigramLM, scripted_table, tok, toy_examples  # noqa: F401  (tok: the fixture)
from tests.micro import untrained_workdir

ROOT = Path(__file__).resolve().parents[2]


def test_derangement_moves_every_index():
    for n in (2, 3, 17, 100):
        p = lp.derangement(n, seed=n)
        assert sorted(p.tolist()) == list(range(n)) and not np.any(p == np.arange(n))
    assert lp.derangement(50, 1).tolist() == lp.derangement(50, 1).tolist() != lp.derangement(50, 2).tolist()
    with pytest.raises(ValueError, match="at least 2"):
        lp.derangement(1, 0)


def test_latent_match_counts_positions_and_whole_spans():
    m = lp.latent_match([[1, 2, 3], [1, 9], [4, 5, 6, 7]], [[1, 2, 3], [1, 2, 3], [4, 0, 6]])
    assert m["exact_span"] == pytest.approx(1 / 3) and m["same_length"] == pytest.approx(1 / 3)
    # position 2: the short span [1, 9] has no third code, which counts as a miss
    assert m["per_position"] == pytest.approx([1.0, 1 / 3, 2 / 3])
    with pytest.raises(ValueError, match="equally many"):
        lp.latent_match([[1]], [[1], [2]])


def test_probe_runs_three_conditions_on_one_sampler(tok):  # noqa: F811
    # a bigram model writes <latent> z0 z1 z2 </latent> 42 whatever comes before: it ignores the span,
    # so gold and shuffled spans give the same answers (the reading a probe must report as +0)
    model = BigramLM(scripted_table(tok, n_latents=3))
    examples = toy_examples(4, ["42", "42", "7", "42"])
    gold = {"t/0": [0, 1, 2], "t/1": [3, 4, 5], "t/2": [0, 1, 2], "t/3": [6]}
    other = {"t/0": [0, 1, 2], "t/1": [3, 4, 5], "t/2": [2, 1, 0], "t/3": [6]}  # every span its own
    r = lp.probe_examples(model, tok, examples, gold, "synthetic", batch_size=2, max_new_tokens=16,
                          max_latents=8, prompt_bucket=16)
    assert {c: v["pass_at_1"] for c, v in r["conditions"].items()} == {"generated": 0.75, "gold": 0.75,
                                                                      "shuffled": 0.75}
    assert r["conditions"]["gold"]["n_latents"] == pytest.approx(10 / 4)  # the given spans' lengths
    assert r["latent_match"]["exact_span"] == 0.5  # t/0 and t/2; t/3 has one gold code, t/1 others
    assert r["latent_match"]["per_position"] == pytest.approx([0.5, 2 / 3, 2 / 3])
    hit = r["by_match"]["generated"]["span_matched"]
    assert hit == {"n": 2, "pass_at_1": 0.5}  # t/0 (gold 42) and t/2 (gold 7) wrote their gold span
    for s in r["samples"]:
        assert s["codes"]["generated"] == [0, 1, 2] and s["codes"]["gold"] == gold[s["id"]]
        assert s["codes"]["shuffled"] in [v for k, v in gold.items() if k != s["id"]]
    # t/0 and t/2 share a gold span: a shuffle between them hands a question its own span, and says so
    assert r["shuffled_equals_gold"] == sum(s["codes"]["shuffled"] == s["codes"]["gold"] for s in r["samples"]) / 4
    q = lp.probe_examples(model, tok, examples, other, "synthetic", batch_size=2, max_new_tokens=16, max_latents=8,
                          prompt_bucket=16, seed=3)
    assert q["shuffled_equals_gold"] == 0.0  # distinct spans: the derangement never gives one back
    assert all(s["codes"]["shuffled"] != other[s["id"]] for s in q["samples"])
    text = lp.format_probe(r)
    assert "gold - shuffled = +0.0 points" in text and "whole span 50.0%" in text


def test_cli_writes_the_probe_of_a_workdir(tmp_path, capsys):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [
        "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
        "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=40", "data.synthetic_eval=6",
        "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=16", "latent.latent_dim=16",
        "latent.source=random", "mesh.fsdp=1", "sampling.prompt_bucket=16", "eval.max_new_tokens=16",
        "eval.max_latents=4", "eval.batch_size=4"])
    w = untrained_workdir(cfg, tmp_path / "w", with_codebook=False)
    assert lp.main(["--workdir", str(w), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "split test" in out and "random latents; 6 questions" in out and "gold - shuffled" in out
    saved = json.loads((w / "sft" / "eval" / "latent_probe_test.json").read_text())
    assert saved["n"] == 6 and set(saved["conditions"]) == {"generated", "gold", "shuffled"}
    assert all(len(s["codes"]["gold"]) in (4, 9) for s in saved["samples"])  # random_latents' lengths
    with pytest.raises(SystemExit):
        lp.main(["--help"])
    assert "does the answer read the latents" in capsys.readouterr().out
