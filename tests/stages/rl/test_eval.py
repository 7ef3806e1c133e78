"""The RL stage's held-out reward curve: fixed rows in fixed-size chunks, means over real rows only,
and the stage writing the curve (step 0, every eval_every steps) reproducibly."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dlr_jax.config import apply_overrides
from dlr_jax.stages import common
from dlr_jax.stages.rl import stage as rl
from dlr_jax.stages.rl.eval import (
    answers_match,
    eval_ks,
    eval_rows,
    held_out_evaluator,
    held_out_reward,
    maj_at_k,
    majority_answer,
    pass_at_k,
)
from tests.stages.rl.test_stage import workdir  # noqa: F401  (the micro RL workdir fixture)


def test_eval_rows_repeat_and_pad_to_the_chunk():
    chunks = eval_rows([[1], [2], [3]], ["a", "b", "c"], samples=3, chunk=4)
    assert [real for _, _, real in chunks] == [4, 4, 1]
    assert [rows for rows, _, _ in chunks][0] == [[1], [1], [1], [2]]
    assert chunks[2][0] == [[3]] * 4 and chunks[2][1] == ["c"] * 4  # padded with its own first row
    assert all(len(rows) == 4 for rows, _, _ in chunks)  # one compiled rollout shape
    with pytest.raises(ValueError, match="samples"):
        eval_rows([[1]], ["a"], samples=0, chunk=4)


def test_pass_at_k_is_the_unbiased_estimator():
    from itertools import combinations
    from math import comb

    for n, c, k in [(4, 0, 1), (4, 1, 1), (4, 1, 2), (5, 2, 3), (8, 3, 4), (8, 8, 8), (6, 5, 2), (10, 1, 10)]:
        # written out: 1 - C(n - c, k) / C(n, k) ...
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
        # ... and counted: the share of the k-subsets of the n samples that hold a correct one
        hits = [any(i < c for i in sub) for sub in combinations(range(n), k)]
        assert pass_at_k(n, c, k) == pytest.approx(sum(hits) / len(hits), abs=1e-12)
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5)]:
        with pytest.raises(ValueError, match="need"):
            pass_at_k(*bad)


def test_maj_at_k_votes_over_disjoint_blocks():
    same = answers_match("synthetic")
    assert same("18", "18.0") and same("1,000", "1000") and not same("18", "-18")
    assert same("abc", "abc") and not same("abc", "18")  # a word is no gold for a numeric checker
    assert majority_answer(["3", None, "4", "4.0", "3"], same) == "3"  # 2 - 2 tie: the answer seen first
    assert majority_answer([None, None], same) is None
    answers = ["18", "18.0", "7", None, "7", "7", "18", "5"]  # n = 8: blocks of 4 -> 18 wins, then 7 wins
    right = lambda a: a is not None and same(a, "18")  # noqa: E731
    assert maj_at_k(answers, 4, right, same) == 0.5
    assert maj_at_k(answers, 8, right, same) == 1.0  # 18 x3, 7 x3: a tie, the answer seen first wins
    assert maj_at_k(answers, 1, right, same) == pytest.approx(3 / 8)
    assert maj_at_k(answers, 3, right, same) == 0.5  # blocks [18 18 7] [None 7 7]; the last 2 rows left out
    with pytest.raises(ValueError, match="need 1 <= k <= n"):
        maj_at_k(answers, 9, right, same)
    assert eval_ks((), 4) == (1, 4) and eval_ks((2, 1, 2), 4) == (1, 2)
    with pytest.raises(ValueError, match="between 1 and rl.eval_samples=4"):
        eval_ks((8,), 4)


def test_held_out_reward_reports_pass_and_maj_at_k():
    from types import SimpleNamespace as NS

    exs = [NS(answer="4"), NS(answer="9")]
    chunks = eval_rows([[1], [2]], exs, samples=4, chunk=3)  # 8 rows in chunks of 3: the last one padded
    texts = {0: ["4", "5", "4", None], 1: ["9", "1", "1", "2"]}
    flat = texts[0] + texts[1]

    def score(rows, rows_exs, i):
        ans = [flat[i * 3 + j] if i * 3 + j < 8 else "x" for j in range(len(rows))]
        ok = np.array([float(a is not None and a == ex.answer) for a, ex in zip(ans, rows_exs, strict=True)])
        return ok, {"answer": ok}, ans

    m = held_out_reward(score, chunks, samples=4, ks=(1, 2, 4), benchmark="synthetic")
    assert m["eval/pass@1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert m["eval/pass@2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)  # C(2,2)/C(4,2), C(3,2)/C(4,2)
    assert m["eval/pass@4"] == 1.0
    # maj@2: prompt 0 blocks [4 5] -> 4 (first seen) right, [4 None] -> 4 right; prompt 1 [9 1] -> 9 right,
    # [1 2] -> 1 wrong. maj@4: prompt 0 -> 4 right; prompt 1 -> 1 (two votes) wrong.
    assert m["eval/maj@2"] == pytest.approx(3 / 4) and m["eval/maj@4"] == 0.5
    assert "eval/maj@1" not in m and m["eval/rollouts"] == 8


def test_held_out_reward_averages_real_rows_only():
    chunks = eval_rows([[1], [2], [3]], ["a", "b", "c"], samples=1, chunk=2)  # last chunk: 1 real, 1 pad

    def score(rows, exs, i):
        r = np.array([float(row[0]) for row in rows])
        return r, {"answer": r / 10, "format": np.ones(len(rows))}

    m = held_out_reward(score, chunks)
    assert m["eval/reward"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3; the pad row (3 again) is dropped
    assert m["eval/accuracy"] == m["eval/reward/answer"] == pytest.approx(0.2)
    assert m["eval/reward/format"] == 1.0 and m["eval/rollouts"] == 3


def test_stage_writes_a_reproducible_held_out_curve(workdir, tmp_path):  # noqa: F811
    cfg, w = workdir
    cfg = apply_overrides(cfg, ["rl.process_weight=0", "rl.eval_prompts=3", "rl.eval_samples=3",
                                "rl.eval_every=2"])
    curves = []
    for run in ("a", "b"):
        wd = tmp_path / run
        wd.mkdir()
        for part in ("config.yaml", "tokenizer", "textsft_cot", "sft"):
            src = w / part
            (shutil.copytree if src.is_dir() else shutil.copy)(src, wd / part)
        res = rl.run(cfg, wd, num_steps=3)
        lines = [json.loads(x) for x in (wd / "rl" / "metrics.jsonl").read_text().splitlines()]
        ev = [m for m in lines if "eval/reward" in m]
        assert [m["step"] for m in ev] == [0, 2, 3]  # before step 1, every 2 steps, and the last
        assert [m["step"] for m in res.evals] == [0, 2, 3] and [m["step"] for m in res.history] == [1, 2, 3]
        for m in ev:
            assert m["eval/rollouts"] == 9
            assert m["eval/reward"] == pytest.approx(m["eval/reward/answer"] + 0.1 * m["eval/reward/format"])
        curves.append([m["eval/reward"] for m in ev])
    assert curves[0] == curves[1]  # fixed prompts and random numbers: the same policy scores the same


def test_a_stop_on_an_evaluation_step_evaluates_it_when_the_run_resumes(workdir, tmp_path, monkeypatch):  # noqa: F811
    """A stop saves at once, before its step's evaluation; the resumed run used to start at the next step and
    never evaluate that one (a review found the curve missing its point). The state now says it is pending."""
    cfg, w = workdir
    cfg = apply_overrides(cfg, ["rl.process_weight=0", "rl.eval_prompts=3", "rl.eval_samples=3", "rl.eval_every=2",
                                "train.rl.checkpoint_every=100"])
    for part in ("config.yaml", "tokenizer", "textsft_cot", "sft"):
        src = w / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / part)
    calls = []
    monkeypatch.setattr(rl.preemption, "should_stop", lambda *a, **k: calls.append(1) or len(calls) == 2)
    first = rl.run(cfg, tmp_path, num_steps=3)
    assert first.preempted and first.step == 2 and [m["step"] for m in first.evals] == [0]
    monkeypatch.setattr(rl.preemption, "should_stop", lambda *a, **k: False)
    second = rl.run(cfg, tmp_path, num_steps=3)
    assert [m["step"] for m in second.evals] == [2, 3] and [m["step"] for m in second.history] == [3]
    lines = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if "eval/reward" in m] == [0, 2, 3]
    assert [m["step"] for m in lines if "reward" in m] == [1, 2, 3]


def test_a_greedy_held_out_curve_does_not_depend_on_the_random_numbers(workdir, tmp_path, monkeypatch):  # noqa: F811
    """rl.eval_temperature=0: the held-out rollouts are the greedy decoding the Pass@1 tables use. The evaluation's
    last chunk is filled with repeats of its first prompt, each drawn with its own random numbers: greedy, they
    write that prompt's completion again; at the rollout temperature (1) they do not."""
    cfg, w = workdir
    base = apply_overrides(cfg, ["rl.process_weight=0", "rl.eval_prompts=4", "rl.eval_samples=1", "rl.eval_every=1",
                                 "rl.eval_split=test", "train.rl.checkpoint_every=100"])
    scored = []  # (completions, example ids) of every rewards() call: the step-0 evaluation's come first
    rewards = rl.GRPOStep.rewards
    monkeypatch.setattr(rl.GRPOStep, "rewards", lambda self, out, group: scored.append(
        (np.asarray(out.tokens), [ex.id for ex in group])) or rewards(self, out, group))
    step0 = {}
    for name, over in {"greedy": ["rl.eval_temperature=0"], "sampled": []}.items():
        (tmp_path / name).mkdir()
        for part in ("config.yaml", "tokenizer", "textsft_cot", "sft"):
            src = w / part
            (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name / part)
        scored.clear()
        rl.run(apply_overrides(base, over), tmp_path / name, num_steps=1)
        step0[name] = scored[0]
    for name, (tokens, ids) in step0.items():
        repeats = [i for i in range(4, len(ids)) if ids[i] == ids[0]]
        assert len(repeats) >= 2, ids  # 4 prompts in a chunk of P x G rows
        same = [np.array_equal(tokens[i], tokens[0]) for i in repeats]
        assert all(same) if name == "greedy" else not all(same), (name, tokens[[0, *repeats]])
    with pytest.raises(ValueError, match="rl.eval_samples=1"):
        rl.run(apply_overrides(base, ["rl.eval_temperature=0", "rl.eval_samples=2"]), tmp_path / "bad")


def test_prompt_pool_and_evaluating_on_it(workdir, tmp_path):  # noqa: F811
    """rl.prompt_pool limits RL to the first training problems (epochs over them); rl.eval_split=pool
    evaluates on those same prompts."""
    cfg, w = workdir
    cfg = apply_overrides(cfg, ["rl.process_weight=0", "rl.prompt_pool=4", "rl.eval_split=pool",
                                "rl.eval_prompts=10", "rl.eval_samples=2", "rl.eval_every=5"])
    for part in ("config.yaml", "tokenizer", "textsft_cot", "sft"):
        src = w / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / part)
    res = rl.run(cfg, tmp_path, num_steps=3)
    state = json.loads((tmp_path / "rl" / "checkpoints" / "3" / "data" / "metadata").read_text())
    n = state["n"]  # the pool's prompts that fit data.max_len - rl.max_new_tokens
    assert 2 <= n <= 4 and state["epoch"] * n + state["pos"] == 3 * 2  # 3 steps x 2 prompts: epochs over the pool
    ev = res.evals
    assert [m["step"] for m in ev] == [0, 3] and all(m["eval/rollouts"] == 2 * n for m in ev)
    tok = common.get_tokenizer(cfg, tmp_path, [])
    with pytest.raises(ValueError, match="no 'test' prompt fits in 0 tokens"):
        held_out_evaluator(apply_overrides(cfg, ["rl.eval_split=test"]), tok, 0, 8, None)


def test_reward_curve_reads_eval_rows(tmp_path):
    from dlr_jax.stages.rl.eval import reward_curve

    p = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "eval/reward": 0.1, "eval/accuracy": 0.05}, {"step": 1, "reward": 0.3},
            {"step": 2, "eval/reward": 0.2, "eval/accuracy": 0.1},
            {"step": 2, "eval/reward": 0.25, "eval/accuracy": 0.2}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert reward_curve(p) == [(0, 0.1, 0.05), (2, 0.25, 0.2)]
    assert reward_curve(tmp_path / "missing.jsonl") == []
