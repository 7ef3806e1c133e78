"""The latent-GRPO throughput benchmark: a micro run of the stage through the CLI writes a sane
section; shares, token rates and the verdict follow the step metrics. No timing thresholds."""

from __future__ import annotations

import math
import re

import pytest

from dlr_jax.bench import cli
from dlr_jax.bench import rl as bench_rl

MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=60", "data.synthetic_eval=20",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=32",
    "latent.latent_dim=16", "latent.source=random", "mesh.fsdp=1", "sampling.prompt_bucket=16",
    "rl.num_prompts=2", "rl.group_size=4", "rl.max_new_tokens=16", "rl.max_latents=4", "rl.inner_epochs=2",
    "train.rl.batch_size=4",
]


def _number(text: str) -> float:
    return float(re.search(r"-?[\d,]*\.?\d+", text).group().replace(",", ""))


def test_cli_writes_the_section_with_sane_numbers(tmp_path):
    out = tmp_path / "B.md"
    out.write_text("notes above\n")
    argv = ["--out", str(out), "--only", "rl", "--repeats", "1", *[a for o in MICRO for a in ("--rl-set", o)]]
    cli.main(argv)
    text = out.read_text()
    assert text.startswith("notes above\n")
    body = text.split("<!-- bench:rl -->\n", 1)[1].split("<!-- /bench:rl -->", 1)[0]
    assert body.startswith("## Latent GRPO step") and "--rl-set rl.num_prompts=2" in body
    # 2 prompts x 4 rollouts, mu = 2 epochs of 2 updates of 4 rollouts.
    assert "2 prompts x G = 4 rollouts" in body
    assert "mu = 2 epochs of 2 updates of 4 rollouts (4 optimizer steps)" in body
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in body.splitlines()
            if line.startswith("| ") and not line.startswith("| phase")}
    shares = 0.0
    for phase in bench_rl.PHASES:
        cells = rows[phase]
        seconds, share, warm = _number(cells[1]), _number(cells[2]), _number(cells[4])
        assert math.isfinite(seconds) and seconds >= 0 and warm >= 0, cells
        shares += share
    assert abs(shares - 100) <= 2  # rounded percentages
    assert _number(rows["step"][1]) > 0 and _number(rows["rollout"][1]) > 0 and _number(rows["update"][1]) > 0
    # One timed step: its phases are parts of it (each printed to 1 ms); what lies between them is the step's own
    # bookkeeping, whose length depends on the machine's load, so only the bound is asserted.
    assert sum(_number(rows[p][1]) for p in bench_rl.PHASES) <= _number(rows["step"][1]) + 0.003
    tps = _number(body.split("Rollouts: **")[1])
    assert math.isfinite(tps) and tps > 0
    per_rollout = _number(body.split("8 rollouts x ")[1])
    assert 1 <= per_rollout <= 16  # at most rl.max_new_tokens
    assert "r_proc off" in body and "Interpretation: " in body


def _result(**phase_s: float) -> bench_rl.RLBenchResult:
    step = lambda scale: {  # noqa: E731
        **{f"time/{p}": scale * s for p, s in phase_s.items()}, "time/step": scale * sum(phase_s.values()),
        "completion_length": 10.0, "n_latents": 4.0, "finished": 0.5, "reward": 0.1, "step": 1}
    return bench_rl.RLBenchResult(
        config="c", source="random init", model="m", params=10, prompts=4, group=8, max_new_tokens=40, max_latents=8,
        inner_epochs=2, batch_size=16, beta=1e-3, process=False, history=[step(5.0), step(1.0), step(3.0), step(1.0)])


def test_shares_rates_and_verdict_follow_the_step_metrics():
    res = _result(rollout=2.0, score=0.5, rewards=0.5, update=1.0)
    assert len(res.timed) == 3 and res.updates_per_step == 4  # 2 epochs x 32 rollouts / 16
    assert res.phase_s("rollout") == 2.0  # median of 2, 6, 2: the warm-up step (x5) is left out
    assert sum(res.share(p) for p in bench_rl.PHASES) == pytest.approx(1.0)
    assert res.share("rollout") == pytest.approx(0.5)
    assert res.tokens_per_s == pytest.approx(32 * 10.0 / 2.0)
    text = bench_rl.interpret(res)
    assert text.startswith("rollout takes 50%") and "Sampling bounds the step" in text
    assert "whole token budget" not in text  # 10 of 40 tokens
    upd = bench_rl.interpret(_result(rollout=1.0, score=0.5, rewards=0.5, update=3.0))
    assert upd.startswith("update takes 60%") and "4 optimizer steps" in upd


def test_bad_arguments_are_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--only", "rl", "--rl-workdir", str(tmp_path)])
    assert "no config.yaml" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="sft stage finished"):
        bench_rl.link_workdir(tmp_path, tmp_path / "scratch")
