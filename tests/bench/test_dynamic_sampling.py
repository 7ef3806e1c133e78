"""The dynamic-sampling reward-curve benchmark at one step on micro models: both arms run, the PNG and its numbers
are written, and the section compares the arms at the plain arm's rollout budget. (The full run, 3 seeds on the
demo's trained workdir, is left to `python -m dlr_jax.bench.dynamic_sampling`.)"""

from __future__ import annotations

import json

import pytest

from dlr_jax.bench import dynamic_sampling as ds
from tests.bench.test_rl import MICRO


def test_curve_points_count_the_rollouts_each_step_generated():
    hist = [{"step": 1}, {"step": 2, "dynamic/rollouts": 24.0}, {"step": 3, "dynamic/rollouts": 8.0}]
    evals = [{"step": 0, "eval/reward": 0.1}, {"step": 2, "eval/reward": 0.2, "eval/accuracy": 0.5},
             {"step": 3, "eval/reward": 0.3, "eval/accuracy": 0.6}]
    curve = ds.curve_of(hist, evals, per_step=8)
    assert [p[:2] for p in curve] == [(0.0, 0.1), (32.0, 0.2), (40.0, 0.3)]
    assert ds.at_budget(curve, 39) == (32.0, 0.2, 0.5)
    with pytest.raises(ValueError, match="no evaluation"):
        ds.at_budget(curve[1:], 10)


def test_one_step_run_writes_the_png_and_the_section(tmp_path):
    out, png = tmp_path / "B.md", tmp_path / "curves.png"
    sets = [*MICRO, "rl.inner_epochs=1", "train.rl.batch_size=8", "rl.process_weight=0", "rl.eval_prompts=2",
            "rl.eval_samples=2", "rl.eval_split=test", "rl.prompt_pool=0"]
    ds.main(["--out", str(out), "--random-init", "--seeds", "1", "--steps", "1", "--png", str(png),
             *[a for s in sets for a in ("--set", s)]])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(png.with_suffix(".json").read_text())
    assert data["budget"] == 8 and [r["arm"] for r in data["runs"]] == list(ds.ARMS)
    for r in data["runs"]:
        assert [p[0] for p in r["curve"]][0] == 0  # the step-0 evaluation, before any rollout
    body = out.read_text().split(f"<!-- bench:{ds.SECTION} -->\n", 1)[1]
    assert body.startswith("## GRPO with and without dynamic sampling")
    assert "| GRPO | 1 |" in body and "| GRPO + dynamic sampling | 1 |" in body and "Budget: 8 rollouts" in body
