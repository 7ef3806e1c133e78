"""Evaluation: the latent-phase processor (forced stop, cap, constrained format), #L and Pass@1
counting, seed statistics, batching without recompiles, results files and the MultiArith subset."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import Config, EvalConfig, ModelConfig
from dlr_jax.data.formats import prompt_ids
from dlr_jax.data.records import Example
from dlr_jax.eval import cli as ev_cli
from dlr_jax.eval import evaluate as ev
from dlr_jax.generate.sampler import Sampler
from dlr_jax.rewards.answer_format import format_reward, is_correct
from dlr_jax.text.tokens import train_bpe

K = 16
CORPUS = ["What is 4 plus 2?", "How many apples does Tom have?", "<<4*2=8>>", "42", "7 pears"] * 5


class BigramLM(nnx.Module):
    """Logits depend only on the last token: behaviour is scripted by the table."""

    def __init__(self, table: np.ndarray):
        self.table = nnx.Param(jnp.asarray(table, jnp.float32))

    def init_cache(self, batch: int, max_len: int) -> dict:
        return {"index": jnp.zeros((), jnp.int32)}

    def forward_cached(self, input_ids, positions, token_mask, cache, inputs_embeds=None):
        return self.table[...][input_ids], {"index": cache["index"] + input_ids.shape[1]}


@pytest.fixture(scope="module")
def tok():
    return train_bpe(CORPUS, 300, num_latents=K, pad_multiple=64)


def _lat(tok, k: int) -> int:
    return tok.latent_id(k)


def scripted_table(tok, *, n_latents: int | None, digits: tuple[str, ...] = ("4", "2")) -> np.ndarray:
    """Scripted path: prompt's last token -> <latent> -> z0 z1 .. -> </latent> <answer> digits
    </answer> <eos>. n_latents=None: the latent chain never closes (z_k -> z_{k+1 mod K}).
    Scripted logits are 30 and all others 0, so sampling at T = 1 follows the script too."""
    v = tok.total_vocab_size
    t = np.zeros((v, v), np.float32)
    nl = prompt_ids(tok, "x")[-1]
    ids = [tok.encode(d)[0] for d in digits]
    path = [nl, tok.latent_start_id]
    if n_latents is None:
        path += [_lat(tok, k) for k in range(K)] + [_lat(tok, 0)]
    else:
        path += [_lat(tok, k) for k in range(n_latents)] + [tok.latent_end_id]
        path += [tok.answer_start_id, *ids, tok.answer_end_id, tok.eos_id]
    for a, b in zip(path[:-1], path[1:], strict=True):
        t[a, b] = 30.0
    if n_latents is None:  # after a forced </latent>, answer 42
        for a, b in zip([tok.latent_end_id, tok.answer_start_id, *ids, tok.answer_end_id],
                        [tok.answer_start_id, *ids, tok.answer_end_id, tok.eos_id], strict=True):
            t[a, b] = 30.0
    return t


def toy_examples(n: int, golds=None) -> list[Example]:
    golds = golds or ["42"] * n
    return [Example(id=f"t/{i}", question=f"What is 4 plus {i}?", cot="", answer=golds[i], source="synthetic")
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# The processor.


def test_forced_stop_after_exactly_n_latents_without_recompile(tok):
    sampler = Sampler(BigramLM(scripted_table(tok, n_latents=None)), prompt_bucket=16)
    prompts = [prompt_ids(tok, ex.question) for ex in toy_examples(4)]
    compiled = None
    for n, constrain in ((0, True), (2, True), (5, True), (3, False)):
        aux = ev.latent_processor_aux(tok, limit=n, constrain=constrain)
        out = sampler.generate(prompts, max_new_tokens=20, stop_ids=[tok.answer_end_id],
                               logits_processor=ev.latent_phase_processor, processor_aux=aux)
        want = [tok.latent_start_id, *[_lat(tok, k) for k in range(n)], tok.latent_end_id,
                tok.answer_start_id, *tok.encode("42"), tok.answer_end_id]
        for r in range(4):
            assert out.tokens[r, : out.lengths[r]].tolist() == want
        # n and the constraint switch are traced: one compiled decode loop for all of them.
        compiled = compiled or sampler.cache_size()
        assert sampler.cache_size() == compiled


def test_dynamic_cap_and_early_stop(tok):
    closing = BigramLM(scripted_table(tok, n_latents=3))
    examples = toy_examples(4)
    kw = dict(max_new_tokens=20, batch_size=4, prompt_bucket=16)
    dyn = ev.evaluate_examples(closing, tok, examples, "synthetic", max_latents=8, **kw)
    assert [s["n_latents"] for s in dyn.samples] == [3] * 4  # the model closes the span itself
    early = ev.evaluate_examples(closing, tok, examples, "synthetic", max_latents=8, force_latents=2, **kw)
    assert [s["n_latents"] for s in early.samples] == [2] * 4
    assert all(s["correct"] and s["format_ok"] for s in early.samples)
    looping = BigramLM(scripted_table(tok, n_latents=None))
    for constrain in (True, False):
        capped = ev.evaluate_examples(looping, tok, examples, "synthetic", max_latents=4,
                                      constrain_format=constrain, **kw)
        assert [s["n_latents"] for s in capped.samples] == [4] * 4
        assert capped.metrics["n_latents"]["mean"] == 4.0
    with pytest.raises(ValueError, match="leaves no room"):
        ev.evaluate_examples(looping, tok, examples, "synthetic", max_latents=30, max_new_tokens=20)


def test_constrained_decoding_is_format_valid(tok):
    rs = np.random.RandomState(0)
    v = tok.total_vocab_size
    table = rs.normal(0, 2.0, (v, v)).astype(np.float32)
    table[:, [tok.answer_start_id, tok.answer_end_id]] += 6.0  # make the answer span reachable
    model = BigramLM(table)
    examples = toy_examples(48)
    bound = dict(latent_start_id=tok.latent_start_id, latent_end_id=tok.latent_end_id,
                 answer_start_id=tok.answer_start_id, answer_end_id=tok.answer_end_id,
                 is_latent=(tok.latent_offset, K))
    kw = dict(max_new_tokens=20, max_latents=6, batch_size=8, temperature=1.0, seeds=2, prompt_bucket=16)
    con = ev.evaluate_examples(model, tok, examples, "synthetic", constrain_format=True, **kw)
    finished = [s for s in con.samples if s["finished"]]
    assert len(finished) > len(con.samples) // 2
    assert all(s["format_ok"] for s in finished)
    assert all(s["prediction"].startswith("<latent>") and s["n_latents"] <= 6 for s in con.samples)
    assert format_reward([tok.latent_start_id, _lat(tok, 1), tok.latent_end_id, tok.answer_start_id,
                          tok.answer_end_id], **bound) == 1.0
    free = ev.evaluate_examples(model, tok, examples, "synthetic", constrain_format=False, **kw)
    # The same model unconstrained breaks the format: the check above is not vacuous.
    assert sum(s["format_ok"] for s in free.samples if s["finished"]) < len([s for s in free.samples
                                                                             if s["finished"]])


# ---------------------------------------------------------------------------------------------
# Counting and statistics.


def test_latent_count_and_accuracy_greedy(tok):
    model = BigramLM(scripted_table(tok, n_latents=3))
    golds = ["42", "7", "42.0", "-42", "42", "1,000"]
    res = ev.evaluate_examples(model, tok, toy_examples(6, golds), "synthetic", max_new_tokens=20, max_latents=8,
                               batch_size=4, seeds=5, prompt_bucket=16)
    assert [s["correct"] for s in res.samples] == [True, False, True, False, True, False]
    assert all(s["answer"] == "42" for s in res.samples)
    # #L counts latents only: <latent> z z z </latent> <answer> 4 2 </answer> is 9 tokens, 3 latents.
    assert all(s["n_latents"] == 3 and s["gen_tokens"] == 9 and len(s["latent_codes"]) == 3
               for s in res.samples)
    m = res.metrics
    assert m["pass_at_1"] == {"mean": 0.5, "std": 0.0, "per_seed": [0.5]}
    assert m["greedy_single_run"] and m["seeds"] == [0] and m["seeds_requested"] == 5 and m["n"] == 6


def test_mean_std_over_sampled_seeds(tok):
    table = scripted_table(tok, n_latents=2)
    four, two, seven = (tok.encode(d)[0] for d in "427")
    table[four, two] = table[four, seven] = 30.0  # after "4": "2" or "7", 50/50
    table[seven, tok.answer_end_id] = 30.0
    res = ev.evaluate_examples(BigramLM(table), tok, toy_examples(24), "synthetic", max_new_tokens=20,
                               max_latents=8, batch_size=8, seeds=3, temperature=1.0,
                               prompt_bucket=16)
    assert len(res.samples) == 72
    per_seed = []
    for seed in range(3):
        rows = [s for s in res.samples if s["seed"] == seed]
        assert [s["id"] for s in rows] == [f"t/{i}" for i in range(24)]
        for s in rows:
            assert s["answer"] in ("42", "47") and s["correct"] == (s["answer"] == "42")
        per_seed.append(np.mean([s["correct"] for s in rows]))
    assert len(set(per_seed)) > 1  # different seeds really sample differently
    p = res.metrics["pass_at_1"]
    np.testing.assert_allclose(p["per_seed"], per_seed)
    np.testing.assert_allclose([p["mean"], p["std"]], [np.mean(per_seed), np.std(per_seed, ddof=0)])
    assert not res.metrics["greedy_single_run"] and res.metrics["seeds"] == [0, 1, 2]


def test_no_recompile_across_batches_of_one_bucket(tok):
    model = BigramLM(scripted_table(tok, n_latents=3))
    sampler = Sampler(model, prompt_bucket=64)
    kw = dict(max_new_tokens=20, max_latents=8, batch_size=4, sampler=sampler)
    ev.evaluate_examples(None, tok, toy_examples(4), "synthetic", **kw)  # one batch: compiles
    before = sampler.cache_size()
    res = ev.evaluate_examples(None, tok, toy_examples(10), "synthetic", **kw)  # 3 batches, last padded
    assert len(res.samples) == 10 and [s["id"] for s in res.samples] == [f"t/{i}" for i in range(10)]
    other = [Example(id=f"o/{i}", question=f"How many apples does Tom have {i}?", cot="", answer="42",
                     source="synthetic") for i in range(7)]
    ev.evaluate_examples(None, tok, other, "synthetic", force_latents=1, **kw)
    assert sampler.cache_size() == before


def test_text_modes_never_emit_latents(tok):
    table = scripted_table(tok, n_latents=3)
    res = ev.evaluate_examples(BigramLM(table), tok, toy_examples(3), "synthetic", mode="cot", max_new_tokens=20,
                               prompt_bucket=16)
    # The scripted path starts with <latent>; masked, the model must say something else.
    assert all(s["n_latents"] == 0 and "<latent>" not in s["prediction"] for s in res.samples)
    with pytest.raises(ValueError, match="mode must be one of"):
        ev.evaluate_examples(BigramLM(table), tok, toy_examples(1), "synthetic", mode="latents")


def test_tiny_latent_lm_runs_constrained(tok):
    from dlr_jax.models.latent_lm import LatentConfig, build_latent_lm

    mcfg = ModelConfig(vocab_size=tok.text_vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=16)
    model = build_latent_lm(mcfg, LatentConfig.from_tokenizer(tok, 8))
    res = ev.evaluate_examples(model, tok, toy_examples(4), "synthetic", max_new_tokens=12, max_latents=4,
                               batch_size=4, prompt_bucket=16)
    assert all(s["n_latents"] <= 4 and s["prediction"].startswith("<latent></latent>") for s in res.samples)


# ---------------------------------------------------------------------------------------------
# Files, CLI, MultiArith.


def test_cli_writes_results_and_multiarith_subset(tok, tmp_path, monkeypatch, capsys):
    from dlr_jax.data.paths import shared_data_dir
    from dlr_jax.data.readers import benchmark_file, load_benchmark

    try:
        f = benchmark_file("multiarith")
    except FileNotFoundError as e:
        pytest.skip(f"MultiArith data not available: {e}")
    if not f.is_file():
        pytest.skip(f"MultiArith data not available under {shared_data_dir()}")
    model = BigramLM(scripted_table(tok, n_latents=3))
    calls = []

    def fake_load(workdir, stage, *, mesh=None):
        calls.append((str(workdir), stage))
        return model, tok, Config(eval=EvalConfig(benchmarks=("svamp",), batch_size=128))

    monkeypatch.setattr(ev, "load_stage_model", fake_load)
    results = ev_cli.main(["--workdir", str(tmp_path), "--stage", "sft", "--benchmarks", "multiarith",
                       "--set", "eval.max_new_tokens=16", "--max-latents", "6", "--no-progress"])
    assert calls == [(str(tmp_path), "sft")]
    out = tmp_path / "sft" / "eval"
    saved = json.loads((out / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert {"date", "git_commit", "config", "eval", "benchmarks", "mode", "stage"} <= set(saved)
    assert saved["eval"]["max_latents"] == 6 and saved["eval"]["max_new_tokens"] == 16
    m = saved["benchmarks"]["multiarith"]
    examples = load_benchmark("multiarith")
    test_ids = {ex.id for ex in load_benchmark("multiarith", split="test")}
    right = {ex.id: is_correct("42", ex.answer, "multiarith") for ex in examples}
    assert m["n"] == 600 and m["mode"] == "latent"
    assert m["pass_at_1"]["mean"] == pytest.approx(np.mean(list(right.values())))
    sub = m["subsets"]["test_180"]
    assert sub["n"] == 180
    assert sub["pass_at_1"]["mean"] == pytest.approx(np.mean([right[i] for i in test_ids]))
    assert m["n_latents"]["mean"] == 3.0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 600
    assert {"id", "benchmark", "seed", "question", "gold", "prediction", "answer", "correct", "n_latents",
            "gen_tokens", "format_ok"} <= set(rows[0])
    table = capsys.readouterr().out
    assert "multiarith/test_180" in table and "Pass@1" in table


def test_synthetic_variants_are_drawn_from_the_workdirs_data_settings(tok, tmp_path, monkeypatch):
    """eval.benchmarks may add synthetic_hard / synthetic_reworded to a synthetic run: they follow the run's
    seed and synthetic settings (not the defaults), so the reworded questions are that run's test problems."""
    from dlr_jax.config import DataConfig, RunConfig
    from dlr_jax.data.sources import load_examples

    cfg = Config(run=RunConfig(seed=5), data=DataConfig(synthetic_eval=24, synthetic_max_steps=2),
                 eval=EvalConfig(benchmarks=("synthetic", "synthetic_hard", "synthetic_reworded"), batch_size=128))
    monkeypatch.setattr(ev, "load_stage_model", lambda w, s, *, mesh=None: (BigramLM(scripted_table(tok, n_latents=2)),
                                                                         tok, cfg))
    res = ev_cli.main(["--workdir", str(tmp_path), "--stage", "sft", "--set", "eval.max_new_tokens=12",
                   "--max-latents", "4", "--no-progress"])
    assert {b: r["n"] for b, r in res["benchmarks"].items()} == dict.fromkeys(cfg.eval.benchmarks, 24)
    rows = [json.loads(line) for line in (tmp_path / "sft/eval/samples.jsonl").read_text().splitlines()]
    for name in cfg.eval.benchmarks:
        want = load_examples(cfg, "test", name)
        assert [r["question"] for r in rows if r["benchmark"] == name] == [e.question for e in want]
    base, reworded = load_examples(cfg, "test"), load_examples(cfg, "test", "synthetic_reworded")
    assert [e.answer for e in reworded] == [e.answer for e in base] and max(len(e.cot.split()) for e in base) == 2


def test_every_benchmark_is_read_before_the_first_is_evaluated(tok, tmp_path, monkeypatch):
    """A bad file or name later in the list stops the run before any generation: before, gsm8k was
    scored first and its results were lost when svamp's file failed."""
    from dlr_jax.config import ConfigError
    from dlr_jax.data.records import DataFormatError

    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "test.jsonl").write_text(
        "".join(json.dumps({"question": f"What is 4 plus {i}?", "answer": "#### 42"}) + "\n" for i in range(3)))
    (data / "svamp").mkdir()
    (data / "svamp" / "SVAMP.json").write_bytes(b'[{"Body": "caf\xe9"}]')
    generated = []
    monkeypatch.setattr(ev, "evaluate_examples", lambda *a, **k: generated.append(a[3]))
    cfg = EvalConfig(benchmarks=("gsm8k", "svamp"), batch_size=4)
    with pytest.raises(DataFormatError, match=r"SVAMP.json:1: not valid UTF-8"):
        ev.run_benchmarks(BigramLM(scripted_table(tok, n_latents=2)), tok, cfg, loader=ev.default_loader(data),
                          out_dir=tmp_path / "out", progress=False)
    with pytest.raises(ConfigError, match="unknown benchmark.s. gsm8kk; known: "):
        ev.run_benchmarks(BigramLM(scripted_table(tok, n_latents=2)), tok,
                          EvalConfig(benchmarks=("gsm8k", "gsm8kk")), loader=ev.default_loader(data))
    assert generated == [] and not (tmp_path / "out").exists()


def test_a_benchmark_missing_under_data_dir_names_the_file_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"gsm_hard/gsmhardv2.jsonl does not exist; get it with .*--data-dir"):
        ev.default_loader(tmp_path)("gsm_hard", None)


def test_a_multiarith_copy_that_is_not_the_600_problem_file_is_scored_without_its_subset(tok, tmp_path, capsys):
    """test_180 is defined on the 600-problem file; a user's own copy is scored whole, and the results say so."""
    from dlr_jax.data.readers import load_benchmark

    items = [{"iIndex": i, "sQuestion": f"What is 4 plus {i}?", "lSolutions": [42.0], "lEquations": ["X=4+38"]}
             for i in range(5)]
    (tmp_path / "MultiArith.json").write_text(json.dumps(items))
    res = ev.run_benchmarks(BigramLM(scripted_table(tok, n_latents=2)), tok,
                            EvalConfig(benchmarks=("multiarith",), batch_size=8, max_new_tokens=12, max_latents=4),
                            loader=lambda name, split: load_benchmark(name, path=tmp_path / "MultiArith.json",
                                                                      split=split), progress=False)
    m = res["benchmarks"]["multiarith"]
    assert m["n"] == 5 and "subsets" not in m
    assert any("multiarith: no test_180 subset" in n for n in res["notes"])
    assert "no test_180 subset, the whole file is scored" in capsys.readouterr().err


def test_help_and_default_modes(capsys):
    with pytest.raises(SystemExit) as e:
        ev_cli.build_parser().parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--force-latents" in text and "--seeds" in text and "--data-dir" in text
    assert [ev.default_mode(s) for s in ("textsft_cot", "textsft_direct", "align", "sft", "rl")] == [
        "cot", "direct", "latent", "latent", "latent"]
    assert ev.parse_benchmark("gsm8k_aug:valid") == ("gsm8k_aug", "valid")


def test_cot_reasoning_length_counts_cot_tokens_before_answer(tok):
    """#L of CoT-SFT is its generated CoT tokens (the paper's count), of latent mode its latents."""
    v = tok.total_vocab_size
    t = np.zeros((v, v), np.float32)
    start, four = prompt_ids(tok, "x")[-1], tok.encode("4")[0]
    cot = list(dict.fromkeys(i for i in tok.encode_plain("what is the sum plus ten") if i not in (start, four)))
    path = [start, *cot, tok.answer_start_id, four, tok.answer_end_id]
    assert len(set(path)) == len(path)  # a bigram table scripts it
    for a, b in zip(path[:-1], path[1:], strict=True):
        t[a, b] = 30.0
    res = ev.evaluate_examples(BigramLM(t), tok, toy_examples(2, ["4", "4"]), "synthetic", mode="cot",
                               max_new_tokens=24, prompt_bucket=16)
    assert [s["L"] for s in res.samples] == [len(cot)] * 2 and res.metrics["L"]["mean"] == len(cot)
    assert all(s["n_latents"] == 0 and s["correct"] for s in res.samples)
    lat = ev.evaluate_examples(BigramLM(scripted_table(tok, n_latents=3)), tok, toy_examples(2), "synthetic",
                               max_new_tokens=20, max_latents=6, prompt_bucket=16)
    assert lat.metrics["L"]["mean"] == lat.metrics["n_latents"]["mean"] == 3.0
    from dlr_jax.eval.scoring import reasoning_length

    direct = reasoning_length(tok, np.asarray(path[1:]), "direct", 0)
    assert direct == 0


def test_wall_time_per_question_is_each_batch_shared_by_its_real_rows(tok):
    model = BigramLM(scripted_table(tok, n_latents=3))
    res = ev.evaluate_examples(model, tok, toy_examples(6), "synthetic", max_new_tokens=20, max_latents=8,
                               batch_size=4, prompt_bucket=16)
    t = res.metrics["timing"]
    assert t["batch_rows"] == [4, 2]  # the last batch is padded to 4 with repeats that are not charged
    (secs,) = t["batch_seconds"]
    assert len(secs) == 2 and all(s > 0 for s in secs)
    by_id = {s["id"]: s["wall_s"] for s in res.samples}
    first = {s["id"] for s in res.samples if s["wall_s"] == pytest.approx(secs[0] / 4)}
    assert len(first) == 4 and all(by_id[i] == pytest.approx(secs[1] / 2) for i in set(by_id) - first)
    assert res.metrics["wall_s_per_question"]["mean"] == pytest.approx(sum(secs) / 6)
    assert t["batch_compiled"] == [[True, False]]  # one prompt bucket: only the first call compiles
    assert res.metrics["warm_wall_s_per_question"]["mean"] == pytest.approx(secs[1] / 2)
    # a sampler that has compiled the shapes already: every batch is warm
    sampler = Sampler(model, prompt_bucket=16)
    kw = dict(max_new_tokens=20, max_latents=8, batch_size=4, sampler=sampler)
    ev.evaluate_examples(None, tok, toy_examples(2), "synthetic", **kw)
    again = ev.evaluate_examples(None, tok, toy_examples(6), "synthetic", **kw).metrics
    assert again["timing"]["batch_compiled"] == [[False, False]]
    assert again["warm_wall_s_per_question"]["mean"] == pytest.approx(sum(again["timing"]["batch_seconds"][0]) / 6)


def test_latent_prefix_puts_the_span_in_the_prompt_and_decodes_only_the_answer(tok):
    table = scripted_table(tok, n_latents=2)
    table[tok.latent_end_id, _lat(tok, 5)] = 40.0  # stronger than <answer>: only the mask can stop it
    golds = ["42", "7", "42"]
    given = {"t/0": [3, 1], "t/1": [0], "t/2": [2, 2, 2]}
    res = ev.evaluate_examples(BigramLM(table), tok, toy_examples(3, golds), "synthetic", max_new_tokens=12,
                               batch_size=2, prompt_bucket=16, latent_prefix=given)
    for s, ex_id in zip(res.samples, ["t/0", "t/1", "t/2"], strict=True):
        # the model starts after the given </latent>: <answer> 4 2 </answer>, no latent of its own
        assert s["answer"] == "42" and s["gen_tokens"] == 4 and s["latents_given"]
        assert s["latent_codes"] == given[ex_id] and s["n_latents"] == s["L"] == len(given[ex_id])
        assert s["format_ok"]  # the grammar judged on the given span + the answer
    assert [s["correct"] for s in res.samples] == [True, False, True] and res.metrics["latents_given"]
    with pytest.raises(ValueError, match="no codes for 1 examples"):
        ev.evaluate_examples(BigramLM(table), tok, toy_examples(4), "synthetic", latent_prefix=given)
    with pytest.raises(ValueError, match="needs mode 'latent'"):
        ev.evaluate_examples(BigramLM(table), tok, toy_examples(3), "synthetic", mode="cot", latent_prefix=given)
    with pytest.raises(ValueError, match="force_latents cannot apply"):
        ev.evaluate_examples(BigramLM(table), tok, toy_examples(3), "synthetic", force_latents=2, latent_prefix=given)


def test_results_name_the_hash_of_the_samples_written_with_them(tok, tmp_path):
    """A kill between the two renames left a new samples.jsonl beside an old results.json: results.json names the
    samples file's SHA-256, and `samples_match` tells a pair from two runs."""
    from dlr_jax.data.readers import load_benchmark

    items = [{"iIndex": i, "sQuestion": f"What is 4 plus {i}?", "lSolutions": [42.0], "lEquations": ["X=4+38"]}
             for i in range(3)]
    (tmp_path / "MultiArith.json").write_text(json.dumps(items))
    out = tmp_path / "out"
    res = ev.run_benchmarks(BigramLM(scripted_table(tok, n_latents=2)), tok,
                            EvalConfig(benchmarks=("multiarith",), batch_size=8, max_new_tokens=12, max_latents=4),
                            loader=lambda name, split: load_benchmark(name, path=tmp_path / "MultiArith.json",
                                                                      split=split), out_dir=out, tag="a",
                            progress=False)
    named = json.loads((out / "results_a.json").read_text())["samples_file"]
    assert named["name"] == "samples_a.jsonl" and named["rows"] == 3 and res["samples_file"] == named
    assert ev.samples_match(out / "results_a.json")
    with open(out / "samples_a.jsonl", "a") as f:  # another run's samples
        f.write(json.dumps({"id": "x"}) + "\n")
    assert not ev.samples_match(out / "results_a.json")
    (out / "samples_a.jsonl").unlink()
    assert not ev.samples_match(out / "results_a.json")
