"""The SFT train-step benchmark at tiny sizes: batch layout, loss parity between our Trainer and the
PyTorch reference step for step, the profile helpers, the report and the CLI. No timing thresholds."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest
import yaml

from dlr_jax.bench import cli, common
from dlr_jax.bench import train as bench_train

# -- batch --------------------------------------------------------------------------------------


def test_sft_batch_layout():
    b = bench_train.sft_batch(6, 20, vocab=50, seed=3)
    assert set(b) == {"tokens", "loss_mask", "segment_ids", "positions"}
    assert all(v.shape == (6, 20) and v.dtype == np.int32 for v in b.values())
    real = b["segment_ids"] > 0
    lengths = real.sum(1)
    assert (lengths >= 10).all() and (lengths <= 20).all()
    assert (real == (np.arange(20) < lengths[:, None])).all()  # right padding
    assert ((b["tokens"] > 0) == real).all() and (b["tokens"] < 50).all()
    assert (b["positions"] == np.where(real, np.arange(20), 0)).all()
    for row in range(6):  # a prompt (not targets) then an answer (targets) up to the end
        mask = b["loss_mask"][row, : lengths[row]]
        start = int(np.argmax(mask))
        assert 1 <= start <= lengths[row] // 2 and mask[start:].all() and not mask[:start].any()
    assert not (b["loss_mask"] & ~real).any()


def test_target_mask_follows_lm_loss_rule():
    b = {"loss_mask": np.array([[1, 1, 1, 1, 0]]), "segment_ids": np.array([[1, 1, 2, 2, 0]])}
    # column 0: no previous token; column 2: starts segment 2; column 4: padding.
    assert bench_train.target_mask(b).tolist() == [[False, True, False, True, False]]


def test_demo_model_config_reads_the_model_section(tmp_path):
    cfg = bench_train.demo_model_config()
    raw = yaml.safe_load(bench_train.DEMO_CONFIG.read_text())["model"]
    assert cfg.vocab_size == bench_train.DEMO_VOCAB
    assert (cfg.hidden_size, cfg.num_layers, cfg.tie_embeddings) == (raw["hidden_size"], raw["num_layers"],
                                                                     raw["tie_embeddings"])
    bad = tmp_path / "c.yaml"
    bad.write_text("run: {seed: 0}\n")
    with pytest.raises(ValueError, match=r"c\.yaml:1: .*'model:'"):
        bench_train.demo_model_config(bad)


# -- the benchmark ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def result() -> bench_train.TrainStepResult:
    case = bench_train.train_cases()["tiny"]
    # No profile: it compiles the step a second time (slow); the helpers are tested on their own above.
    return bench_train.bench_train(case, repeats=2, threads=2, profile=False, log=lambda _: None)


def test_bench_train_sides_agree_step_for_step(result):
    assert result.sides == (bench_train.OURS, "torch2", "torch1")
    assert result.batch_tokens == 4 * 16 and 0 < result.target_tokens < result.real_tokens <= 64
    for side in result.sides:
        assert len(result.step_s[side]) == len(result.fwd_s[side]) == 2 and len(result.losses[side]) == 5
        assert all(t > 0 for t in result.step_s[side]) and result.tps(side) > 0
    # Same weights, batch, loss and optimiser: the losses track each other while they fall.
    ours = result.losses[bench_train.OURS]
    assert ours[-1] < ours[0] and result.fwd_loss_gap < 1e-5 and result.max_loss_gap < 1e-4
    assert result.opt_kind.startswith(("fused=True", "foreach=True"))
    assert result.step_flops > 0 and np.isnan(result.compile_s) and not result.op_kinds
    assert set(result.matmul) == {"xla", "torch2", "torch1"}
    d, f, v, kv = 32, 64, 96, 16
    assert result.param_count == 2 * v * d + 2 * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d


def test_render_train_reports_both_ratios_and_the_verdict(result):
    info = common.machine_info()
    text = bench_train.render_train([result], "python -m dlr_jax.bench --only train", info, allow_load=True)
    assert text.startswith("## SFT train step") and info["cpu"] in text
    assert "| dlr_jax Trainer (XLA, 2 threads) | PyTorch (2 threads) | PyTorch (1 thread) |" in text
    assert f"**{result.tps('ours'):,.0f}**" in text and "| target tokens/s" in text
    best = result.ratio(result.best_torch)
    assert f"**{best:.2f}x** (target >= 1.0x: {'met' if best >= 1 else 'missed'})" in text
    assert f"at equal threads (2): **{result.ratio('torch2'):.2f}x**" in text
    assert ("meets" in text) == (best >= 1) and "Interpretation:" in text and "Costliest ops" not in text


def test_render_train_explains_a_miss_from_the_profile(result):
    slow = dataclasses.replace(
        result,
        step_s={**result.step_s, bench_train.OURS: [10 * max(result.step_s["torch1"] + result.step_s["torch2"])] * 2},
        op_kinds={"matmuls": 0.2, "layout copies / transposes": 0.5, "broadcasts": 0.1,
                  "elementwise / reductions / other": 0.2},
        top_ops=[("copy_bitcast_fusion.8", 0.4, "f32[384,3584]", "jit(step_fn)/transpose(jvp())/jit(silu)"),
                 ("ynn_fusion.1", 0.1, "f32[3584,384]", "jit(step_fn)/jvp()/dot_general")],
    )
    text = bench_train.render_train([slow], "cmd", common.machine_info(), allow_load=True)
    assert "(target >= 1.0x: missed)" in text and "misses the 1.0x target" in text
    assert "Our XLA op time is 20% matmuls, 50% transposing copies, 10% broadcasts" in text
    assert ("1 of the 2 costliest ops are backward ops: `copy_bitcast_fusion.8` (`jit(silu)` gradient "
            "written transposed into `f32[384,3584]` by a plain loop, 400 ms)") in text
    assert "- `copy_bitcast_fusion.8` 400.0 ms/step, `f32[384,3584]`" in text


def test_render_train_writes_no_speed_up_measured_on_a_busy_machine(result, monkeypatch):
    monkeypatch.setattr(common, "cpu_threads", lambda: 2)  # the 2-core host the 1.5 limit is sized for
    busy = bench_train.render_train([dataclasses.replace(result, loads=(2.4,))], "cmd", common.machine_info())
    assert "Speed-up not written: the load average was 2.40 (> 1.5 on 2 cores)" in busy
    assert "| speed-up of ours over this side | - | (not written) | (not written) |" in busy
    assert "x** (target" not in busy and "Interpretation:" not in busy and "Losses agree" in busy
    idle = bench_train.render_train([dataclasses.replace(result, loads=(0.2,))], "cmd", common.machine_info())
    assert "(target >= 1.0x:" in idle and "Interpretation:" in idle
    assert result.loads and result.loads[0] >= 0  # bench_train records it


def test_main_writes_the_train_section(tmp_path, monkeypatch, result):
    seen = []

    def fake(case, *, repeats, log):
        seen.append((case.name, repeats))
        return result

    monkeypatch.setattr(bench_train, "bench_train", fake)
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nkept\n")
    cli.main(["--out", str(out), "--only", "train", "--train-cases", "tiny,demo", "--train-repeats", "3"])
    text = out.read_text()
    assert seen == [("tiny", 3), ("demo", 3)]
    assert text.startswith("# Benchmarks\n\nkept\n") and text.count("<!-- bench:train -->") == 1
    assert text.count("### tiny:") == 2 and text.endswith("<!-- /bench:train -->\n")


def test_the_cli_gates_ratios_on_the_load_before_any_section_ran(tmp_path, monkeypatch, result):
    """`make bench` runs sampling and compile before train in one process: the 1-minute load they leave must not
    refuse train's ratios, and a busy machine before the run must."""
    monkeypatch.setattr(common, "cpu_threads", lambda: 2)
    monkeypatch.setattr(bench_train, "bench_train", lambda case, *, repeats, log: dataclasses.replace(
        result, loads=(3.0,)))  # what a reading after our own earlier sections would say
    out = tmp_path / "BENCHMARKS.md"
    for start, refused in ((0.4, False), (2.5, True)):
        monkeypatch.setattr(cli, "load_average", lambda s=start: s)
        cli.main(["--out", str(out), "--only", "train", "--train-cases", "tiny", "--train-repeats", "1"])
        text = out.read_text()
        assert ("(target >= 1.0x:" not in text) == refused
        assert ("Speed-up not written: the load average was 2.50" in text) == refused


def test_train_flags_are_checked_before_anything_runs(tmp_path):
    ns = lambda cases, reps: argparse.Namespace(train_cases=cases, train_repeats=reps)
    assert bench_train.check_arguments(ns("demo,medium", 5)) is None
    assert "unknown case" in bench_train.check_arguments(ns("demo,huge", 5))
    assert ">= 1" in bench_train.check_arguments(ns("demo", 0))
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "x.md"), "--only", "train", "--train-cases", "nope"])
    assert not (tmp_path / "x.md").exists()
