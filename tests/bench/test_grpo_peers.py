"""`python -m dlr_jax.bench --only grpo_peers`: the shared workload, the worker protocol, the report
and its section. The peers' workers need their own venvs (`make peers`); without one their test
part is skipped with the reason printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlr_jax.bench import common, grpo_peers
from dlr_jax.bench import peer_protocol as protocol

TINY = common.SIZES["tiny"]


def test_workload_model_tokenizer_and_prompts_agree(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    work = grpo_peers.build_workload(tmp_path, TINY, mu=4, steps=2, prompts=3, group=2, prompt_len=5)
    assert AutoConfig.from_pretrained(tmp_path).vocab_size == TINY.vocab
    tok = AutoTokenizer.from_pretrained(tmp_path)
    for ids, text in zip(work["prompts"], work["prompt_texts"], strict=True):
        assert len(ids) == 5 and 0 not in ids  # id 0 is pad/EOS: never in a prompt
        assert tok(text, add_special_tokens=False)["input_ids"] == ids  # text and ids are one prompt
        assert tok.decode(ids) == text
    assert tok.eos_token_id == work["eos_id"] == tok.pad_token_id == 0
    again = grpo_peers.build_workload(tmp_path / "unused", TINY, mu=1, steps=2, prompts=3, group=2, prompt_len=5,
                                      hf_dir=tmp_path)
    assert again["prompts"] == work["prompts"] and again["hf_dir"] == str(tmp_path)  # one model for every mu
    assert not (tmp_path / "unused").exists()


def test_protocol_lines_parse_and_steps_are_checked():
    assert protocol.parse("some framework output\n") is None
    assert protocol.parse('@@STEP {"total": 1.5}\n') == ("STEP", {"total": 1.5})
    assert protocol.parse("@@READY\n") == ("READY", {})
    with pytest.raises(ValueError, match="malformed STEP"):
        protocol.parse("@@STEP {oops")
    with pytest.raises(ValueError, match="carries list"):
        protocol.parse("@@STEP [1]")
    rec = protocol.step_record(2.0, generate=1.0, update=0.5)
    assert rec == {"generate": 1.0, "score": 0.0, "rewards": 0.0, "update": 0.5, "total": 2.0}
    with pytest.raises(ValueError, match="unknown phase"):
        protocol.step_record(1.0, backward=1.0)
    assert protocol.cheap_reward([2, 3, 4, 5]) == 0.5 and protocol.cheap_reward([]) == 0.0


def test_worker_commands_say_why_a_peer_cannot_run(tmp_path):
    argv, why = grpo_peers.worker_command("dlr_jax", tmp_path / "w.json", tmp_path)
    assert argv[1:3] == ["-m", "dlr_jax.bench.grpo_ours"] and why == ""
    argv, why = grpo_peers.worker_command("TRL", tmp_path / "w.json", tmp_path)
    assert argv is None and "make peers" in why and str(tmp_path / "trl") in why


def _side(fw, mu, totals, error=""):
    steps = [protocol.step_record(t, generate=t / 2, score=t / 8, rewards=0.0, update=3 * t / 8) for t in totals]
    return grpo_peers.Side(fw, mu, steps, {"framework": fw, "x": "1.0"}, [f"{fw} note"], error)


def _result(loads):
    workload = {"model": TINY.describe(), "prompts": [[1, 2]] * 8, "group": 8, "new_tokens": 64, "temperature": 1.0,
                "beta": 1e-3, "lr": 1e-5}
    sides = [_side("dlr_jax", 4, [9.0, 1.0, 1.2, 0.8]), _side("TRL", 4, [20.0, 4.0, 4.4, 3.6]),
             _side("tunix", 4, [], error="no venv at /x (`make peers` creates it)")]
    return grpo_peers.PeersResult(workload, sides, loads)


def test_report_writes_ratios_only_on_an_idle_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "cpu_threads", lambda: 2)  # the 2-core host the 1.5 limit is sized for
    info = {"cpu": "cpu", "cores": "2", "load": "0.1", "versions": "v", "date": "today"}
    idle = grpo_peers.render_section(_result([0.2, 0.4]), "cmd", info)
    assert "| 4 | dlr_jax | 1.00 | 0.50 | 0.12 | 0.00 | 0.38 | — | — | 9.0 |" in idle
    assert "| 4 | TRL | 4.00 |" in idle and "**4.00x**" in idle
    assert "| 4 | tunix | not run: no venv at /x (`make peers` creates it)" in idle
    assert "- TRL (x 1.0): TRL note." in idle
    # the loads taken between steps count the benchmark's own threads: only the one before any work gates
    assert "**4.00x**" in grpo_peers.render_section(_result([0.2, 2.0]), "cmd", info)
    busy = grpo_peers.render_section(_result([3.0, 2.0]), "cmd", info)
    assert "**4.00x**" not in busy and "(not written)" in busy and "load average was 3.00" in busy
    assert "**4.00x**" in grpo_peers.render_section(_result([3.0]), "cmd", info, allow_load=True)
    # the limit scales with the cores: 3.0 is a busy 2-core machine but a quiet 16-core one
    monkeypatch.setattr(common, "cpu_threads", lambda: 16)
    assert "**4.00x**" in grpo_peers.render_section(_result([3.0]), "cmd", info)
    assert "(> 12 on 16 cores)" in grpo_peers.render_section(_result([13.0]), "cmd", info)
    monkeypatch.setattr(common, "cpu_threads", lambda: 2)
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nhand-written\n")
    common.write_section(out, "grpo_peers", idle)
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written\n") and "<!-- bench:grpo_peers -->" in text
    assert text.rstrip().endswith("<!-- /bench:grpo_peers -->")


def test_report_says_how_fast_each_update_runs_and_what_2x_trl_would_need():
    res = _result([0.2])
    res.update_flops, res.gemm = 30e9, {"XLA": 180.0, "torch": 150.0}
    info = {"cpu": "cpu", "cores": "2", "load": "0.1", "versions": "v", "date": "today"}
    text = grpo_peers.render_section(res, "cmd", info)
    # dlr_jax: 4 updates of 30 GFLOP in 0.375 s; TRL: in 1.5 s
    assert "| 0.38 | 320 | — |" in text and "| 1.50 | 80 | **4.00x** |" in text
    assert "one optimizer step of the update is 30.0 GFLOP" in text and "XLA 180 GFLOP/s, torch 150" in text
    # 2x TRL = 2.0 s; our other phases take 0.625 s, leaving 1.375 s for 120 GFLOP: 87 GFLOP/s, 48 % of 180
    assert "takes 2.00 s; with our other phases (0.62 s) the update would have to run at 87 GFLOP/s (48 %" in text


def test_update_flops_and_gemm_rates():
    size = common.Size(hidden=256, layers=4, heads=4, kv_heads=2, mlp=768, vocab=4096)
    per_token_layers = 2 * 4 * (256 * 64 * (2 * 4 + 2 * 2) + 3 * 256 * 768) + 4 * 4 * 80 * 4 * 64
    # x3 for the backward pass, the untied head 2 * d * V per token, also x3
    assert grpo_peers.update_flops(size, 64, 80) == 64 * 80 * (3 * per_token_layers + 3 * 2 * 256 * 4096)
    rates = common.matmul_gflops([2], n=128, repeats=2)
    assert rates["xla"] > 0 and all(v > 0 for v in rates.values()) and set(rates) <= {"xla", "torch2"}


def test_mu_and_framework_arguments_are_checked():
    import argparse

    ap = argparse.ArgumentParser()
    grpo_peers.add_arguments(ap)
    assert grpo_peers.check_arguments(ap.parse_args([])) is None
    assert "positive" in grpo_peers.check_arguments(ap.parse_args(["--peers-mu", "0"]))
    assert "unknown framework" in grpo_peers.check_arguments(ap.parse_args(["--peers-only", "dlr_jax,verl"]))
    assert grpo_peers.parse_mus("1,4") == (1, 4)


def test_gpu_runs_get_their_own_section_settings_and_machine_line():
    import argparse

    ap = argparse.ArgumentParser()
    grpo_peers.add_arguments(ap)
    assert grpo_peers.section_name(ap.parse_args([])) == "grpo_peers"
    assert grpo_peers.section_name(ap.parse_args(["--peers-device", "gpu"])) == "grpo_peers_gpu"
    # two JAX workers share one card, in full fp32 as PyTorch's default; CPU runs keep JAX off any GPU
    gpu = grpo_peers.worker_env("gpu")
    assert gpu["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and gpu["JAX_DEFAULT_MATMUL_PRECISION"] == "float32"
    assert gpu["JAX_PLATFORMS"] == "cuda"  # a JAX worker without the GPU fails rather than timing the CPU
    assert grpo_peers.worker_env("cpu") == {"JAX_PLATFORMS": "cpu"}
    res = _result([0.2])
    res.workload["device"] = "gpu"
    info = {"cpu": "cpu", "cores": "16", "load": "0.1", "versions": "v", "date": "today", "gpu": "1 x NVIDIA H200"}
    text = grpo_peers.render_section(res, "cmd", info)
    assert text.startswith("## GRPO step on a GPU: dlr_jax vs TRL and tunix")
    assert "GPU: 1 x NVIDIA H200;" in text and "fp32 matmuls (no TF32) on the GPU" in text
    assert "| 4 | dlr_jax | 1.000 | 0.500 |" in text  # milliseconds show on a GPU
    cpu_text = grpo_peers.render_section(_result([0.2]), "cmd", info | {"gpu": ""})
    assert "GPU:" not in cpu_text and "on the GPU" not in cpu_text


def test_workers_run_interleaved_steps(capsys):
    """Our worker always; each peer whose venv exists (`make peers`), else skipped with the reason."""
    frameworks = ["dlr_jax"]
    for fw, sub in grpo_peers.PEER_VENVS.items():
        python = grpo_peers.DEFAULT_PEERS_DIR / sub / "bin" / "python"
        if python.is_file():
            frameworks.append(fw)
        else:
            with capsys.disabled():
                print(f"\n{fw} worker not tested: no venv at {python.parent.parent} (`make peers` creates it)")
    res = grpo_peers.bench_grpo_peers(TINY, mus=(1,), steps=1, frameworks=tuple(frameworks), log=lambda m: None,
                                      new_tokens=8, prompt_len=4, prompts=2, group=2, unstack_layers="off")
    # --peers-unstack reaches our worker's rollouts (off: the layer scan, the GPU default, here on the CPU)
    assert "rollouts' decode loop: layer scan (sampling.unstack_layers=off)" in res.side("dlr_jax", 1).notes
    for fw in frameworks:
        side = res.side(fw, 1)
        assert side is not None and side.ok, (fw, side and side.error)
        assert len(side.steps) == 2 and all(s["total"] >= s["generate"] > 0 for s in side.steps), side.steps
        assert side.versions["framework"] == fw
    assert len(res.loads) == 3 and Path(res.workload["hf_dir"]).name == "model"
