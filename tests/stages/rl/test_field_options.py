"""The RL stage with what the field added to GRPO: the sampler/trainer mismatch metric (zero with an fp32 sampling
copy, not with bf16) and its truncated IS correction, GSPO, overlong handling, pass@k / maj@k during RL, and DAPO's
dynamic sampling (its selection of groups; a run that keeps one compiled update program, reports its drops and
resumes bit-exactly from a checkpoint of a step that refilled)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace as NS

import chex
import jax
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import apply_overrides
from dlr_jax.generate import sampler as sampling
from dlr_jax.rewards.answer_format import RewardInputs, register_reward
from dlr_jax.run.handoff import load_stage_model
from dlr_jax.stages.rl import stage as rl
from dlr_jax.stages.rl.step import GRPOStep, Rollouts
from tests.stages.rl.test_stage import one_rl_step, workdir  # noqa: F401  (the micro RL workdir fixture)
from tests.stages.rl.test_step import toy_model, toy_rollouts  # noqa: F401 - the fixture is used by name


@register_reward("test_even_gold_share", overwrite=True)
def _even_gold_share(inputs: RewardInputs) -> np.ndarray:
    """A reward with a spread inside the groups of even-gold problems only (the share of the generation budget a
    rollout used); 0 for the others: an untrained policy then has both kinds of groups, as dynamic sampling needs."""
    m = inputs.completion_mask
    even = np.asarray([int(g) % 2 == 0 for g in inputs.golds])
    return np.where(even, m.sum(1) / m.shape[1], 0.0).astype(np.float32)


def _copy_inputs(w, dst):
    dst.mkdir(parents=True, exist_ok=True)
    for part in ("config.yaml", "tokenizer", "textsft_cot", "sft"):
        src = w / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / part)
    return dst


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


# ----------------------------------------------------------------------------------------------
# Dynamic sampling's choice of groups, on a stub step (no model): fast.


def _stub_step(rewards_per_call, *, max_refills=3, tol=1e-6, g=2):
    """A GRPOStep whose rollout call i returns rows tagged (call i, row r) and whose rewards are
    `rewards_per_call[i]`."""
    step = GRPOStep.__new__(GRPOStep)
    step.rl = NS(group_size=g, dynamic_sampling=True, dynamic_sampling_tol=tol,
                 dynamic_sampling_max_refills=max_refills, overlong="keep")
    calls = []

    def rollout(rows, step_, call=0):
        calls.append((step_, call, [r[0] for r in rows]))
        n = len(rows)
        out = sampling.SampleOutput(tokens=np.full((n, 3), call), logprobs=np.zeros((n, 3), np.float32),
                                    lengths=np.full(n, 3), prompt_lengths=np.ones(n), finished=np.ones(n, bool))
        return Rollouts(out, {"tokens": np.asarray([[call, r] for r in range(n)])}, 0.0)

    def rewards(out, group):
        r = np.asarray(rewards_per_call[int(out.tokens[0, 0])], np.float32)
        return [NS(n_latents=1)] * len(r), r, {"answer": r}

    step.rollout, step.rewards = rollout, rewards
    return step, calls


def test_dynamic_sampling_keeps_groups_with_a_spread_and_refills_in_order():
    f32 = np.float32
    near = [f32(0.25) * f32(0.2) + f32(0.1) * f32(0.3), f32(0.1) * f32(0.8)]  # 0.08 and 0.08, not to the bit
    per_call = [
        [1, 1, 0, 1, *near],  # call 0: group 1 only
        [0, 0, 2, 2, 5, 5],  # call 1: nothing
        [1, 0, 3, 3, 0, 4],  # call 2: groups 0 and 2
    ]
    step, calls = _stub_step(per_call)
    drawn = iter([[[7]] * 6, [[8]] * 6])
    col = step.collect([[6]] * 6, [None] * 6, 5, refill=lambda: (next(drawn), [None] * 6))
    assert [(s, c, rows[0]) for s, c, rows in calls] == [(5, 0, 6), (5, 1, 7), (5, 2, 8)]  # the step's calls, in order
    # trained on: call 0's group 1, then call 2's groups 0 and 2 in generation order; the surplus is not trained on
    np.testing.assert_array_equal(col.ro.batch["tokens"], [[0, 2], [0, 3], [2, 0], [2, 1], [2, 4], [2, 5]][:6])
    np.testing.assert_array_equal(col.reward, [0, 1, 1, 0, 0, 4])
    assert col.metrics["dynamic/refills"] == 2 and col.metrics["dynamic/rollouts"] == 18
    assert col.metrics["dynamic/groups_dropped"] == 6 and col.metrics["dynamic/groups_discarded"] == 0
    assert col.metrics["dynamic/groups_topped_up"] == 0
    assert col.metrics["reward"] == pytest.approx(np.mean(np.concatenate(per_call)))  # over everything generated

    # out of refills: the batch is topped up with dropped groups, first dropped first
    step, calls = _stub_step([[1, 1, 0, 1, 2, 2], [3, 3, 4, 4, 5, 5]], max_refills=1)
    col = step.collect([[6]] * 6, [None] * 6, 0, refill=lambda: ([[7]] * 6, [None] * 6))
    assert len(calls) == 2
    np.testing.assert_array_equal(col.reward, [0, 1, 1, 1, 2, 2])
    assert col.metrics["dynamic/groups_topped_up"] == 2 and col.metrics["dynamic/groups_dropped"] == 5
    # exact equality (tol 0) keeps the near-equal group: enough groups in the first call, no refill; with the
    # tolerance it is dropped, and the surplus group of the refill is discarded
    first = [[1, 0, 0, 1, *near], [2, 3, 4, 5, 6, 6]]
    step, calls = _stub_step(first, tol=0.0)
    col = step.collect([[6]] * 6, [None] * 6, 0, refill=lambda: pytest.fail("no refill needed"))
    assert len(calls) == 1 and col.metrics["dynamic/refills"] == 0 and col.metrics["dynamic/groups_dropped"] == 0
    step, calls = _stub_step(first)
    col = step.collect([[6]] * 6, [None] * 6, 0, refill=lambda: ([[7]] * 6, [None] * 6))
    np.testing.assert_array_equal(col.reward, [1, 0, 0, 1, 2, 3])
    assert col.metrics["dynamic/groups_discarded"] == 1 and col.metrics["dynamic/groups_dropped"] == 2


def test_prompt_stream_draws_without_counting_steps():
    a, b = rl.PromptStream(7, 3, seed=2), rl.PromptStream(7, 3, seed=2)
    first, more = next(a), a.draw()
    assert a.steps == 1
    np.testing.assert_array_equal(np.concatenate([first, more]), np.concatenate([next(b), next(b)]))
    c = rl.PromptStream(7, 3, seed=2)
    c.set_state(a.get_state())
    np.testing.assert_array_equal(next(c), next(b))
    assert c.steps == 2


def test_loss_with_unit_is_weights_equals_the_uncorrected_loss(toy_model):  # noqa: F811
    """The stage's loss with `sampler_is_correction=truncated`: sampler log-probs equal to the old policy's give
    weights of 1, hence the uncorrected loss and gradient; others change it, and are logged."""
    from tests.stages.rl.test_fast_paths import loss_and_grad

    batch, out = toy_rollouts(toy_model, temperature=0.7)
    batch["advantages"] = np.random.RandomState(2).normal(size=len(out.tokens)).astype(np.float32)
    batch["sampler_logps"] = batch["old_logps"]
    kw = dict(temperature=0.7, beta=0.0)
    plain = loss_and_grad(rl.make_grpo_loss(**kw), toy_model, batch)
    fixed = loss_and_grad(rl.make_grpo_loss(**kw, sampler_is_correction="truncated"), toy_model, batch)
    assert fixed[0] == plain[0]
    for a, b in zip(jax.tree.leaves(fixed[1]), jax.tree.leaves(plain[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    w = float(batch["completion_mask"].sum())
    assert fixed[2]["sampler_is/mean"] / w == pytest.approx(1.0) and fixed[2]["sampler_is/capped"] == 0
    off = dict(batch, sampler_logps=batch["old_logps"] - 0.8 * batch["completion_mask"])  # exp(0.8) > cap 2
    moved = loss_and_grad(rl.make_grpo_loss(**kw, sampler_is_correction="truncated", sampler_is_cap=2.0),
                           toy_model, off)
    assert moved[0] != pytest.approx(plain[0]) and moved[2]["sampler_is/capped"] / w == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs the sampler's log-probs"):
        loss_and_grad(rl.make_grpo_loss(**kw, sampler_is_correction="truncated"), toy_model,
                       {k: v for k, v in batch.items() if k != "sampler_logps"})


# ----------------------------------------------------------------------------------------------
# The stage.


def test_mismatch_metric_is_zero_with_an_fp32_copy_and_not_with_bf16(workdir, tmp_path):  # noqa: F811
    """fp32 copy, overlong=mask; bf16 copy with an old-policy pass (mu = 2), the truncated IS correction, GSPO, the
    soft overlong penalty and pass@k / maj@k in the held-out evaluation."""
    cfg, w = workdir
    base = apply_overrides(cfg, ["rl.process_weight=0", "train.rl.checkpoint_every=100"])
    fp32 = rl.run(apply_overrides(base, ["rl.sample_dtype=float32", "rl.overlong=mask"]),
                  _copy_inputs(w, tmp_path / "fp32"), num_steps=1).history[0]
    assert fp32["logprob_gap/max"] < 1e-5 and fp32["logprob_gap/kl"] < 1e-9
    assert "sampler_is/mean" not in fp32 and "reward/overlong" not in fp32
    assert fp32["overlong/masked"] == pytest.approx(1 - fp32["finished"])

    bf16_cfg = apply_overrides(base, [
        "rl.sample_dtype=bf16", "rl.inner_epochs=2", "rl.sampler_is_correction=truncated", "rl.sampler_is_cap=1.5",
        "rl.importance_sampling_level=sequence", "rl.loss_agg_mode=seq-mean-token-mean", "rl.overlong=soft_penalty",
        "rl.overlong_buffer=8", "rl.eval_prompts=2", "rl.eval_samples=4", "rl.eval_k=[1,2,4]"])
    res = rl.run(bf16_cfg, _copy_inputs(w, tmp_path / "bf16"), num_steps=1)
    bf16 = res.history[0]
    print("logprob_gap/mean, /max, /kl: fp32 copy", [fp32[f"logprob_gap/{k}"] for k in ("mean", "max", "kl")],
          "bf16 copy", [bf16[f"logprob_gap/{k}"] for k in ("mean", "max", "kl")])
    assert bf16["updates"] == 2  # mu = 2: the old policy was scored (its own pass)
    assert bf16["logprob_gap/mean"] > 1e-4 and bf16["logprob_gap/kl"] > 0  # weights rounded to bf16
    assert 0 < bf16["sampler_is/mean"] and 0 <= bf16["sampler_is/capped"] <= 1
    assert -1 <= bf16["reward/overlong"] <= 0
    for m in res.evals:
        assert {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/maj@2", "eval/maj@4"} <= set(m)
        assert m["eval/pass@1"] == pytest.approx(m["eval/accuracy"])
        assert m["eval/pass@1"] <= m["eval/pass@2"] <= m["eval/pass@4"] <= 1
    with pytest.raises(ValueError, match="rl.eval_k"):
        rl.run(apply_overrides(bf16_cfg, ["rl.eval_k=[8]"]), tmp_path / "bad")


def _guarded_run(monkeypatch, cfg, w, steps, patches=None):
    """rl.run with the update's loss, the rollout decode loop and the teacher-forced scoring each allowed one trace
    (chex): the refills must reuse the compiled programs."""
    from dlr_jax.generate import decoding

    chex.clear_trace_counter()
    make = rl.make_grpo_loss
    monkeypatch.setattr(rl, "make_grpo_loss", lambda **kw: chex.assert_max_traces(make(**kw), n=1))
    monkeypatch.setattr(sampling, "decode_loop", chex.assert_max_traces(decoding.decode_loop, n=1))
    monkeypatch.setattr(sampling, "_score_states", chex.assert_max_traces(decoding.score_states_body, n=1))
    if patches:
        patches()
    try:
        return rl.run(cfg, w, num_steps=steps)
    finally:
        monkeypatch.undo()


def test_dynamic_sampling_run_keeps_one_program_reports_drops_and_resumes_bit_exactly(
        workdir, tmp_path, monkeypatch):  # noqa: F811
    cfg, w = workdir
    cfg = apply_overrides(cfg, [
        "rl.process_weight=0", "rl.dynamic_sampling=true", "rl.dynamic_sampling_max_refills=3",
        "rl.extra_rewards=[test_even_gold_share=1.0]", f"rl.reward_modules=[{__name__}]",
        "train.rl.checkpoint_every=1"])
    straight = _guarded_run(monkeypatch, cfg, _copy_inputs(w, tmp_path / "straight"), 3)
    hist = straight.history
    assert all(set(rl.DYNAMIC_METRICS) <= set(m) for m in hist)
    assert sum(m["dynamic/groups_dropped"] for m in hist) > 0 and hist[1]["dynamic/refills"] > 0  # step 2 refilled
    state = json.loads((tmp_path / "straight" / "rl" / "checkpoints" / "3" / "data" / "metadata").read_text())
    drawn = sum(1 + m["dynamic/refills"] for m in hist) * cfg.rl.num_prompts
    assert state["steps"] == 3 and state["epoch"] * state["n"] + state["pos"] == drawn  # refills drew from the stream

    # the same run, stopped by a signal that arrives during step 2's refills: saved when the step ends, resumed
    resumed_dir = _copy_inputs(w, tmp_path / "resumed")
    asked = []
    draw = rl.PromptStream.draw

    def draw_and_stop(stream):
        if stream.steps == 2:
            asked.append(stream.steps)
        return draw(stream)

    def patches():
        monkeypatch.setattr(rl.PromptStream, "draw", draw_and_stop)
        monkeypatch.setattr(rl.preemption, "should_stop", lambda *a, **k: bool(asked))

    first = _guarded_run(monkeypatch, cfg, resumed_dir, 3, patches)
    assert first.preempted and first.step == 2 and asked
    resumed = _guarded_run(monkeypatch, cfg, resumed_dir, 3)
    (again,) = resumed.history
    want = hist[2]
    assert again["step"] == 3
    for k, v in want.items():
        if not k.startswith("time/"):
            assert again[k] == v, (k, again[k], v)  # the same rollouts, refills and update, to the bit
    a = jax.tree.leaves(nnx.state(load_stage_model(tmp_path / "straight", "rl", mesh=one_rl_step())[0], nnx.Param))
    b = jax.tree.leaves(nnx.state(load_stage_model(resumed_dir, "rl", mesh=one_rl_step())[0], nnx.Param))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
