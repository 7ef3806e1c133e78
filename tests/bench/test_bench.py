"""Bench machinery at tiny sizes: section updates in BENCHMARKS.md, scan/unrolled parity, the
sampling comparison against transformers, and the CLI end to end. No timing thresholds."""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.bench import cli, common
from dlr_jax.bench import compile as compile_bench
from dlr_jax.bench import sampling as sampling_bench
from dlr_jax.models.transformer import Transformer

TINY = common.SIZES["tiny"]


# -- BENCHMARKS.md sections ----------------------------------------------------------------------

OTHER = "<!-- bench:sft -->\n## SFT\n| a | b |\n<!-- /bench:sft -->\n"


def test_update_section_appends_then_replaces_and_keeps_the_rest():
    text = "# Benchmarks\n\nHand-written note.\n\n" + OTHER + "trailing line, no newline"
    once = common.update_section(text, "compile", "## Compile\nv1\n")
    assert once.startswith(text + "\n")  # appended, nothing before it changed
    assert once.count("<!-- bench:compile -->") == 1 and "v1" in once
    twice = common.update_section(once, "compile", "## Compile\nv2")
    assert "v1" not in twice and "v2\n<!-- /bench:compile -->\n" in twice
    assert twice.replace("v2", "v1") == once  # only the body changed
    assert OTHER in twice and "Hand-written note." in twice
    # A section in the middle is replaced in place; what follows it stays put.
    mid = common.update_section(twice, "sft", "## SFT\nnew")
    assert mid.index("## SFT\nnew") < mid.index("## Compile") and "| a | b |" not in mid


def test_update_section_on_empty_text():
    out = common.update_section("", "sampling", "body")
    assert out == "<!-- bench:sampling -->\nbody\n<!-- /bench:sampling -->\n"


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("x\n<!-- bench:compile -->\nbody\n", 2, "never closed"),
        ("<!-- bench:compile -->\n<!-- bench:compile -->\n<!-- /bench:compile -->\n", 2, "second"),
        ("x\ny\n<!-- /bench:compile -->\n", 3, "without an opening"),
    ],
)
def test_update_section_rejects_broken_markers_with_file_and_line(text, line, what):
    with pytest.raises(ValueError, match=rf"^BM\.md:{line}: .*{what}"):
        common.update_section(text, "compile", "body", source="BM.md")


def test_write_section_creates_file_with_preamble(tmp_path):
    out = tmp_path / "B.md"
    common.write_section(out, "compile", "## C\n")
    text = out.read_text()
    assert text.startswith(common.PREAMBLE) and text.endswith("<!-- /bench:compile -->\n")


def test_gpu_model_reads_nvidia_smi_and_is_empty_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    assert common.gpu_model() == ""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 580.159.04'\necho 'NVIDIA H200, 580.159.04'\n")
    fake.chmod(0o755)
    assert common.gpu_model() == "2 x NVIDIA H200, driver 580.159.04"
    info = {"cpu": "cpu", "cores": "16", "load": "0.1", "versions": "v", "date": "today", "gpu": common.gpu_model()}
    assert "(load average at start 0.1); GPU: 2 x NVIDIA H200, driver 580.159.04; v" in common.header("t", "c", info)[3]


def test_parse_only():
    assert cli.parse_only("compile, sampling") == ["compile", "sampling"]
    with pytest.raises(argparse.ArgumentTypeError, match="sft"):
        cli.parse_only("sampling,sft")


def test_token_agreement():
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    b = np.array([[1, 2, 0, 4], [5, 6, 7, 8]])
    frac, rows, prefix = sampling_bench.token_agreement(a, b)
    assert frac == 7 / 8 and rows == 1 and prefix == (2 + 4) / 2
    with pytest.raises(ValueError, match="shape"):
        sampling_bench.token_agreement(a, b[:, :3])


# -- compile benchmark -------------------------------------------------------------------------


def test_unrolled_forward_matches_scanned_model():
    cfg = common.model_config(TINY, 3)
    # Initialised under one jit: eager init dispatches (and compiles) every random op on its own.
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(1))))
    state = jax.jit(lambda: nnx.state(Transformer(cfg, rngs=nnx.Rngs(1))))()
    ids = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab, (2, 7)), jnp.int32)
    scanned = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))(state, ids)
    unrolled = jax.jit(lambda st, x: compile_bench.unrolled_forward(nnx.merge(graphdef, st), x))(state, ids)
    assert float(jnp.std(scanned)) > 1e-3  # random logits, not a degenerate constant
    np.testing.assert_allclose(np.asarray(unrolled), np.asarray(scanned), rtol=1e-5, atol=1e-5)


def test_time_compile_uses_a_fresh_function_each_time():
    cfg = common.model_config(TINY, 2)
    fwd_a = compile_bench._forward(nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0], "scan")
    fwd_b = compile_bench._forward(nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0], "scan")
    assert fwd_a is not fwd_b  # jax caches by function identity: a reused one would not recompile
    for variant in ("scan", "unrolled"):
        lower_s, compile_s = compile_bench.time_compile(cfg, variant, batch=2, seq=8)
        assert lower_s > 0 and compile_s > 0


def test_the_scan_row_scans_even_a_shallow_stack():
    # scan_layers=auto loops over <= 8 layers on CPU; the "scanned" row must still time a scan at 4 layers
    ids = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    for variant, scans in (("scan", True), ("unrolled", False)):
        fwd, state = compile_bench.abstract_forward(common.model_config(TINY, 2), variant)
        jaxpr = str(jax.make_jaxpr(fwd)(state, ids))
        assert ("scan[" in jaxpr) == scans, variant


# -- sampling benchmark ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampling_result() -> sampling_bench.SamplingResult:
    return sampling_bench.bench_sampling(TINY, batch=3, prompt_len=8, new_tokens=5, repeats=1, log=lambda _: None)


def test_bench_sampling_runs_both_sides_on_the_same_weights(sampling_result):
    res = sampling_result
    assert res.tokens == 15 and res.threads == common.cpu_threads()
    assert len(res.ours_s) == len(res.hf_s) == len(res.ours_prefill_s) == len(res.hf_prefill_s) == 1
    assert all(t > 0 for t in res.ours_s + res.hf_s) and res.ours_tps > 0 and res.hf_tps > 0
    # Identical fp32 weights and greedy decoding: a tiny model's tokens agree everywhere.
    assert res.identical_frac == 1.0 and res.identical_rows == 3 and res.mean_common_prefix == 5
    d, f, v, kv = TINY.hidden, TINY.mlp, TINY.vocab, TINY.kv_heads * TINY.hidden // TINY.heads
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d  # q, o; k, v; gate, up, down; two norms
    assert res.param_bytes == 4 * (2 * v * d + TINY.layers * per_layer + d)


def test_render_sampling_has_the_table_and_verdict(sampling_result):
    info = common.machine_info()
    text = sampling_bench.render_sampling(sampling_result, "python -m dlr_jax.bench", info, allow_load=True)
    assert text.startswith("## Greedy sampling") and info["cpu"] in text and "transformers" in info["versions"]
    assert f"{sampling_result.ours_tps:,.0f}" in text and "| decode step ms" in text
    assert ("meets" in text) == (sampling_result.ours_tps / sampling_result.hf_tps >= 3)
    assert "100.0% of positions" in text and "same process" in text
    assert "| decode step GFLOP/s" in text
    assert sampling_result.gemm_gflops > 0 and sampling_result.peak_gflops > 0
    # With a decode step measured (a tiny model's can round to nothing), the verdict says what 3x needs.
    timed_res = dataclasses.replace(sampling_result, ours_s=[1.0], ours_prefill_s=[0.2], hf_s=[2.0],
                                    hf_prefill_s=[0.3])
    need = sampling_result.step_gflop / ((1e3 * 1.7 / 4) / 3 / 1e3)  # transformers' step 1.7 s / 4 steps, / 3
    text = sampling_bench.render_sampling(timed_res, "python -m dlr_jax.bench", info, allow_load=True)
    assert "A 3x decode step" in text and f"needs {need:.0f} GFLOP/s" in text
    # ... and the memory floor: the bytes a step must read at the measured streaming rate.
    assert sampling_result.stream_gbs > 0 and "| decode step floor ms" in text
    assert f"no step is faster than {timed_res.floor_ms:.1f} ms" in text
    # ... and the step's weight matmuls alone, as the loop multiplies them: their bytes are every weight
    # the step reads (the KV cache aside), and the rest of our step is said in ms.
    res = sampling_result
    assert res.step_stream_gbs > 0
    assert f"| the step's weight matmuls alone ms: {res.weight_bytes / 1e6:.0f} MB" in text
    assert f"take {timed_res.matmuls_ms:.1f} ms" in text and f"{7 * TINY.layers + 1} dots" in text
    unmeasured = dataclasses.replace(timed_res, step_stream_gbs=float("nan"))
    text = sampling_bench.render_sampling(unmeasured, "python -m dlr_jax.bench", info, allow_load=True)
    assert "weight matmuls alone" not in text and "| decode step floor ms" in text


def test_render_sampling_writes_no_speed_up_measured_on_a_busy_machine(sampling_result, monkeypatch):
    monkeypatch.setattr(common, "cpu_threads", lambda: 2)  # the 2-core host the 1.5 limit is sized for
    info = common.machine_info()
    res = dataclasses.replace(sampling_result, ours_s=[1.0], ours_prefill_s=[0.2], hf_s=[2.0], hf_prefill_s=[0.3])
    idle = sampling_bench.render_sampling(dataclasses.replace(res, loads=(0.3,)), "cmd", info)
    assert "Speed-up: **2.00x** (target >= 3x)" in idle and "Interpretation:" in idle
    busy = sampling_bench.render_sampling(dataclasses.replace(res, loads=(3.2,)), "cmd", info)
    assert "**2.00x**" not in busy and "Interpretation:" not in busy
    assert "Speed-up not written: the load average was 3.20 (> 1.5 on 2 cores)" in busy
    assert "| seconds per call (median) | 1.00 | 2.00 |" in busy and "Greedy tokens identical at 100.0%" in busy
    forced = sampling_bench.render_sampling(dataclasses.replace(res, loads=(3.2,)), "cmd", info, allow_load=True)
    assert "Speed-up: **2.00x**" in forced
    assert sampling_result.loads and sampling_result.loads[0] >= 0  # bench_sampling records it


def test_decode_bytes_count_the_weights_read_per_step_and_the_whole_cache():
    # medium, by hand: layer weights (as in the FLOP count) + the head, and K and V for 8 layers x
    # 16 rows x 4 KV heads x 192 slots x head_dim 64; fp32.
    size = common.SIZES["medium"]
    weights = 8 * (2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 1536) + 512 * 8192
    cache = 2 * 8 * 16 * 4 * 192 * 64
    assert size.decode_bytes(16, 192) == 4 * (weights + cache)


def test_decode_flops_count_every_matmul_and_the_attention():
    # medium: hidden 512 (8 heads x 64), 4 KV heads, MLP 1536, 8 layers, vocab 8192; by hand:
    # q, o 512x512 each; k, v 512x256 each; gate, up, down 512x1536 each; head 512x8192.
    size = common.SIZES["medium"]
    params = 8 * (2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 1536) + 512 * 8192
    attention = 2 * 2 * 8 * 8 * 64 * 96  # QK^T and PV: 8 layers x 8 heads x head_dim 64 x 96 positions
    assert size.decode_flops(16, 96) == 16 * (2 * params + attention)


# -- CLI -----------------------------------------------------------------------------------------


def test_main_updates_only_its_section(tmp_path, capsys):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n" + OTHER)
    argv = ["--out", str(out), "--only", "compile", "--size", "tiny", "--repeats", "1",
            "--compile-layers", "1,2", "--batch", "2", "--prompt-len", "8"]
    cli.main(argv)
    first = out.read_text()  # re-runs replace the section: test_update_section_appends_then_replaces...
    assert first.startswith("# Benchmarks\n\n" + OTHER)
    assert "## Compile time: 2-layer vs 1-layer forward" in first and "| scanned" in first
    assert "| unrolled (reference) |" in first and "Command: `python -m dlr_jax.bench --out" in first
    assert first.count("<!-- bench:compile -->") == 1 and first.endswith("<!-- /bench:compile -->\n")
    assert "wrote section" in capsys.readouterr().out


def test_main_rejects_bad_flags(tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "x.md"), "--only", "nope"])
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "x.md"), "--compile-layers", "4"])
    assert not (tmp_path / "x.md").exists()


def test_sampling_on_a_gpu_needs_jax_and_torch_both_there(monkeypatch):
    # JAX on the CPU (as under make bench): a GPU comparison is refused, not run on the CPU, and the message
    # says how to get the CPU one.
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert sampling_bench.sampling_device() == "cpu"
    with pytest.raises(RuntimeError, match="JAX and PyTorch both.*JAX_PLATFORMS=cpu"):
        sampling_bench.sampling_device("gpu")


def test_gpu_path_times_the_unstacked_sampler_and_writes_its_own_section(monkeypatch, tmp_path):
    # The GPU code path run on the CPU (PyTorch's "GPU" mapped to the CPU): the extra unstacked sampler is
    # timed with the others, its tokens compared, and the section carries no host roofline.
    monkeypatch.setattr(sampling_bench, "sampling_device", lambda device=None: "gpu")
    monkeypatch.setitem(sampling_bench.TORCH_DEVICE, "gpu", "cpu")
    res = sampling_bench.bench_sampling(TINY, batch=3, prompt_len=8, new_tokens=5, repeats=2, log=lambda _: None)
    assert res.device == "gpu" and len(res.unstacked_s) == len(res.unstacked_prefill_s) == 2
    assert res.unstacked_identical_frac == 1.0 and res.identical_frac == 1.0 and res.unstacked_first_s > 0
    timed_res = dataclasses.replace(res, ours_s=[1.0], ours_prefill_s=[0.2], hf_s=[4.0], hf_prefill_s=[0.4],
                                    unstacked_s=[0.9], unstacked_prefill_s=[0.2])
    text = sampling_bench.render_sampling(timed_res, "python -m dlr_jax.bench", common.machine_info(), allow_load=True)
    assert text.startswith("## Greedy sampling on a GPU") and "Speed-up: **4.00x**" in text and "meets" in text
    assert "`unstack_layers=True`" in text and "1.14x the layer scan's" in text  # (0.8 / 4) / (0.7 / 4)
    assert "decode step floor" not in text and "GFLOP/s" not in text
