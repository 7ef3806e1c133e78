"""Greedy sampling: `dlr_jax.generate.sampler.Sampler` against `transformers` `generate` (`--only sampling`).

A random HF Llama is saved and imported with `load_hf`, so both sides run identical fp32 parameters
(PyTorch with its KV cache on the other side); the greedy tokens are compared. Both sides run in
the same process, interleaved repeat by repeat, so a busy shared machine slows them alike; the
medians are reported. Where JAX's default device is a GPU, both sides run on it (fp32 matmuls without
TF32 on both) and the section is `sampling_gpu`; the sampler is also timed with its layers unstacked
(`Sampler(unstack_layers=True)`: the CPU default, opt-in on GPUs with `sampling.unstack_layers`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dlr_jax.bench.common import Size, cpu_threads, header, load_average, ratio_refusal, timed
from dlr_jax.bench.host_rates import copy_bandwidth_gbs, step_matmuls_gbs, stream_gbs, xla_matmul_gflops


@dataclasses.dataclass(frozen=True)
class SamplingResult:
    size: Size
    batch: int
    prompt_len: int
    new_tokens: int
    repeats: int
    threads: int
    ours_s: list[float]  # seconds per generate call (prefill + decode, tokens on the host)
    hf_s: list[float]
    ours_first_s: float  # first call: compile + one run
    hf_first_s: float
    ours_prefill_s: list[float]  # the same call with max_new_tokens=1: prefill + one token
    hf_prefill_s: list[float]
    param_bytes: int
    copy_gbs: float  # host memory copy bandwidth measured in the same run, for scale
    identical_frac: float  # fraction of generated positions with the same token
    identical_rows: int
    mean_common_prefix: float
    gemm_gflops: float = float("nan")  # XLA fp32 [batch, hidden] @ [hidden, mlp]: the decode step's own shape
    peak_gflops: float = float("nan")  # XLA fp32 1024^3 matmul: what this machine reaches at best
    stream_gbs: float = float("nan")  # a batch-row projection by 256 MB of weights, as the decode loop compiles it
    step_stream_gbs: float = float("nan")  # the decode step's own weight matmuls alone (`step_matmuls_gbs`)
    loads: tuple[float, ...] = ()  # the load average before any work (later ones would count our own threads)
    device: str = "cpu"  # "gpu": both sides ran on JAX's default GPU
    unstacked_s: list[float] = dataclasses.field(default_factory=list)  # GPU: Sampler(unstack_layers=True)
    unstacked_prefill_s: list[float] = dataclasses.field(default_factory=list)
    unstacked_first_s: float = float("nan")
    unstacked_identical_frac: float = float("nan")  # its tokens against the scanned sampler's

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    def step_ms(self, full: list[float], prefill: list[float]) -> float:
        """Median decode-step time: (full call - prefill call) / the extra tokens."""
        return 1e3 * (statistics.median(full) - statistics.median(prefill)) / max(self.new_tokens - 1, 1)

    @property
    def step_gflop(self) -> float:
        """One decode step's FLOPs (GFLOP), at the mean cached context of the decode."""
        return self.size.decode_flops(self.batch, self.prompt_len + self.new_tokens / 2) / 1e9

    @property
    def step_bytes(self) -> int:
        """Bytes a decode step reads at least (weights and the whole fixed-shape KV cache)."""
        return self.size.decode_bytes(self.batch, self.prompt_len + self.new_tokens)

    @property
    def floor_ms(self) -> float:
        """The decode step if it did nothing but read `step_bytes` at the rate one large matmul streams."""
        return self.step_bytes / (self.stream_gbs * 1e6)

    @property
    def weight_bytes(self) -> int:
        """Weight bytes a decode step reads (every layer's projections and the head)."""
        return self.size.decode_bytes(self.batch, 0)

    @property
    def matmuls_ms(self) -> float:
        """The step's weight matmuls alone, as the decode loop multiplies them (`step_matmuls_gbs`)."""
        return self.weight_bytes / (self.step_stream_gbs * 1e6)

    @property
    def ours_tps(self) -> float:
        return self.tokens / statistics.median(self.ours_s)

    @property
    def hf_tps(self) -> float:
        return self.tokens / statistics.median(self.hf_s)



def build_hf_llama(size: Size, out_dir: Path, seed: int = 0) -> Any:
    """A random HF Llama (HF's own init) saved to `out_dir`; EOS is unset so nothing stops early."""
    import torch
    import transformers as tf

    tf.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.mlp,
                         num_hidden_layers=size.layers, num_attention_heads=size.heads,
                         num_key_value_heads=size.kv_heads, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = tf.LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out_dir)
    return model



def token_agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, int, float]:
    """(fraction of equal positions, rows equal throughout, mean length of the common prefix)."""
    if a.shape != b.shape:
        raise ValueError(f"token arrays differ in shape: {a.shape} vs {b.shape}")
    eq = a == b
    prefix = np.where(eq.all(1), a.shape[1], np.argmin(eq, axis=1))
    return float(eq.mean()), int(eq.all(1).sum()), float(prefix.mean())


TORCH_DEVICE = {"cpu": "cpu", "gpu": "cuda"}  # where PyTorch runs for each of our devices


def sampling_device(device: str | None = None) -> str:
    """"cpu" or "gpu": where both sides run (None: where JAX's default device is). A GPU needs a
    PyTorch built with CUDA too, else the comparison would pit a GPU against a CPU."""
    import torch

    device = device or ("gpu" if jax.default_backend() == "gpu" else "cpu")
    if device == "gpu" and (jax.default_backend() != "gpu" or not torch.cuda.is_available()):
        raise RuntimeError(f"sampling on a GPU needs JAX and PyTorch both on one: JAX's default backend is "
                           f"{jax.default_backend()!r}, torch.cuda.is_available() is {torch.cuda.is_available()}; "
                           "for the CPU comparison run with JAX_PLATFORMS=cpu (as make bench does)")
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    return device


def bench_sampling(size: Size, *, batch: int = 16, prompt_len: int = 64, new_tokens: int = 128,
                   repeats: int = 3, threads: int | None = None, seed: int = 0, device: str | None = None,
                   unstacked: bool = True, log: Callable[[str], None] = print) -> SamplingResult:
    """Greedy generation of `batch` x `new_tokens` tokens from `batch` x `prompt_len` prompts.
    `device`: "cpu", "gpu" or None (JAX's default device; see `sampling_device`). `unstacked`: on a GPU,
    also time `Sampler(unstack_layers=True)` (its compile grows with depth). JAX claims 75 % of a GPU's
    memory at start unless XLA_PYTHON_CLIENT_PREALLOCATE=false; PyTorch gets the rest."""
    import contextlib

    import torch

    from dlr_jax.convert import load_hf
    from dlr_jax.generate.sampler import Sampler

    loads = (load_average(),)
    device = sampling_device(device)
    on_gpu = device == "gpu"
    threads = threads or cpu_threads()
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        hf = build_hf_llama(size, Path(tmp), seed)
        _, model = load_hf(tmp)
    torch_device = TORCH_DEVICE[device]
    hf = hf.to(torch_device)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    prompts = np.random.default_rng(seed).integers(1, size.vocab, (batch, prompt_len)).astype(np.int32)
    sampler = Sampler(model, prompt_bucket=prompt_len)
    # JAX's default fp32 matmul on a GPU is TF32; PyTorch's is full fp32: match PyTorch.
    precision = (lambda: jax.default_matmul_precision("float32")) if on_gpu else contextlib.nullcontext
    ids_t = torch.tensor(prompts, dtype=torch.long, device=torch_device)

    def ours(n: int = new_tokens, s: Sampler = sampler) -> np.ndarray:
        with precision():
            return s.generate(prompts, max_new_tokens=n, temperature=0.0).tokens

    def theirs(n: int = new_tokens) -> np.ndarray:
        with torch.inference_mode():
            out = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), do_sample=False, use_cache=True,
                              max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
        return out[:, prompt_len:].cpu().numpy()  # on the host, as ours are (and the copy waits for the GPU)

    ours_first, ours_tok = timed(ours)
    hf_first, hf_tok = timed(theirs)
    ours(1), theirs(1)  # warm up the prefill-only variants (ours compiles them)
    log(f"sampling: first calls ours {ours_first:.2f}s, transformers {hf_first:.2f}s")
    if ours_tok.shape != (batch, new_tokens) or hf_tok.shape != (batch, new_tokens):
        raise RuntimeError(f"expected {batch}x{new_tokens} new tokens on both sides, got ours "
                           f"{ours_tok.shape}, transformers {hf_tok.shape}")
    sides: dict[str, Callable[[int], np.ndarray]] = {"ours": ours, "transformers": theirs}
    extra: dict[str, Any] = {}
    if on_gpu and unstacked:  # the CPU's default layout, measured where it is not the default
        unstacked_sampler = Sampler(model, prompt_bucket=prompt_len, unstack_layers=True)
        sides["unstacked"] = lambda n=new_tokens: ours(n, unstacked_sampler)
        first, tok = timed(sides["unstacked"])
        sides["unstacked"](1)
        extra = {"unstacked_first_s": first, "unstacked_identical_frac": token_agreement(tok, ours_tok)[0]}
    calls: dict[str, list[float]] = {k: [] for k in sides}
    prefills: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(repeats):  # interleaved so load spikes hit every side alike
        for name, fn in sides.items():
            calls[name].append(timed(fn)[0])
            prefills[name].append(timed(lambda fn=fn: fn(1))[0])
        log(f"sampling: repeat {r + 1}/{repeats}: " + ", ".join(
            f"{k} {calls[k][-1]:.3f}s (prefill {prefills[k][-1]:.3f}s)" for k in sides))
    frac, rows, prefix = token_agreement(ours_tok, hf_tok)
    nan = float("nan")  # the CPU roofline below says nothing about a GPU
    gemm = nan if on_gpu else xla_matmul_gflops(batch, size.hidden, size.mlp, repeats=50)
    peak = nan if on_gpu else xla_matmul_gflops(1024, 1024, 1024, repeats=5)
    return SamplingResult(size, batch, prompt_len, new_tokens, repeats, threads, calls["ours"], calls["transformers"],
                          ours_first, hf_first, prefills["ours"], prefills["transformers"], param_bytes,
                          nan if on_gpu else copy_bandwidth_gbs(), frac, rows, prefix, gemm, peak,
                          nan if on_gpu else stream_gbs(batch), nan if on_gpu else step_matmuls_gbs(size, batch),
                          loads, device, calls.get("unstacked", []), prefills.get("unstacked", []), **extra)



def render_sampling(res: SamplingResult, command: str, info: dict[str, str], allow_load: bool = False) -> str:
    """The section; its speed-up and interpretation are left out (saying why) when the machine was busy
    before the benchmark started (`ratio_refusal`), unless `allow_load`."""
    if res.device == "gpu":
        return render_sampling_gpu(res, command, info, allow_load)
    refusal = ratio_refusal(list(res.loads), allow_load)
    med_o, med_h = statistics.median(res.ours_s), statistics.median(res.hf_s)
    ratio = res.ours_tps / res.hf_tps
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    step_o, step_h = res.step_ms(res.ours_s, res.ours_prefill_s), res.step_ms(res.hf_s, res.hf_prefill_s)
    gbs = lambda ms: f"{res.param_bytes / (ms * 1e6):.1f}" if ms > 0 else "n/a"
    flops = lambda ms: f"{res.step_gflop / (ms / 1e3):.0f}" if ms > 0 else "n/a"
    lines = header("Greedy sampling: dlr_jax.generate.sampler vs transformers generate", command, info) + [
        f"Model: random Llama, {res.size.describe()}; fp32; the same weights on both sides (HF model "
        "saved, then imported with `dlr_jax.convert.load_hf`). "
        f"Batch {res.batch} prompts x {res.prompt_len} tokens, {res.new_tokens} new tokens each, greedy, "
        f"no EOS stop ({res.tokens} generated tokens per call). Time per call = prefill + decode, tokens "
        f"back on the host. Median of {res.repeats} repeats after one warm-up call; both sides ran in the "
        f"same process, repeats interleaved. torch threads = {res.threads} = cores visible to XLA.",
        "",
        "| | dlr_jax Sampler (JAX/XLA) | transformers generate (PyTorch) |",
        "|---|---|---|",
        f"| tokens/s (median) | **{res.ours_tps:,.0f}** | {res.hf_tps:,.0f} |",
        f"| seconds per call (median) | {med_o:.2f} | {med_h:.2f} |",
        f"| seconds per call (all repeats) | {fmt(res.ours_s)} | {fmt(res.hf_s)} |",
        f"| first call (compile + run) s | {res.ours_first_s:.2f} | {res.hf_first_s:.2f} |",
        f"| compile / warm-up overhead s (first - median) | {res.ours_first_s - med_o:.2f} "
        f"| {res.hf_first_s - med_h:.2f} |",
        f"| prefill call (1 new token) s, median | {statistics.median(res.ours_prefill_s):.2f} "
        f"| {statistics.median(res.hf_prefill_s):.2f} |",
        f"| decode step ms ((call - prefill call) / {res.new_tokens - 1}) | {step_o:.1f} | {step_h:.1f} |",
        f"| parameter bytes / decode step, GB/s (host copy bandwidth: {res.copy_gbs:.1f}) "
        f"| {gbs(step_o)} | {gbs(step_h)} |",
        f"| decode step GFLOP/s ({res.step_gflop:.2f} GFLOP a step; XLA fp32 matmul: {res.gemm_gflops:.0f} at "
        f"{res.batch} x {res.size.hidden} @ {res.size.hidden} x {res.size.mlp}, {res.peak_gflops:.0f} at 1024^3) "
        f"| {flops(step_o)} | {flops(step_h)} |",
        f"| decode step floor ms: {res.step_bytes / 1e6:.0f} MB read a step (layer weights, head, a KV cache of "
        f"{res.prompt_len + res.new_tokens} slots) at {res.stream_gbs:.1f} GB/s (a {res.batch}-row matmul over "
        f"256 MB of out-major weights, as the decode loop multiplies them) | {res.floor_ms:.1f} | |",
        *([] if math.isnan(res.step_stream_gbs) else [
            f"| the step's weight matmuls alone ms: {res.weight_bytes / 1e6:.0f} MB of weights at "
            f"{res.step_stream_gbs:.1f} GB/s (every layer's projections and the head, out-major, in a loop: "
            f"`bench.host_rates.step_matmuls_gbs`) | {res.matmuls_ms:.1f} | |"]),
        "",
    ]
    same = (f"Greedy tokens identical at {100 * res.identical_frac:.1f}% of positions; {res.identical_rows}/"
            f"{res.batch} rows identical throughout; mean common prefix {res.mean_common_prefix:.1f}/"
            f"{res.new_tokens} tokens" + (" (once a near-tie flips a token, the rest of that row follows a "
                                          "different prefix)." if res.identical_rows < res.batch else "."))
    if refusal:  # the times stay in the table; the ratio and what is read from it go
        lines += [same, "", f"Speed-up {refusal} (load average before the benchmark: {res.loads[0]:.2f})."]
    else:
        lines += [f"Speed-up: **{ratio:.2f}x** (target >= 3x). {same}", "",
                  f"Interpretation: {interpret_sampling(res)}"]
    return "\n".join(lines) + "\n"


def interpret_sampling(res: SamplingResult) -> str:
    """One line from the measured numbers: where the speed-up comes from and what bounds it."""
    ratio = res.ours_tps / res.hf_tps
    step_o, step_h = res.step_ms(res.ours_s, res.ours_prefill_s), res.step_ms(res.hf_s, res.hf_prefill_s)
    pre_o, pre_h = statistics.median(res.ours_prefill_s), statistics.median(res.hf_prefill_s)
    decode_share = 1 - pre_o / statistics.median(res.ours_s)
    verdict = "meets" if ratio >= 3 else "misses"
    step = f"{step_h / step_o:.1f}x" if step_o > 0 else "n/a"
    streamed = res.param_bytes / (step_o * 1e6) if step_o > 0 else 0.0
    rate = res.step_bytes / (step_o * 1e6) if step_o > 0 else 0.0
    if not math.isnan(res.stream_gbs) and rate > 0.8 * res.stream_gbs:
        limits = (f"our decode step reads its {res.step_bytes / 1e6:.0f} MB at {rate:.1f} GB/s, near the "
                  f"{res.stream_gbs:.1f} GB/s at which a {res.batch}-row matmul streams weights here, so it is "
                  "memory-bound; only fewer bytes (bf16 weights, a cache read up to its filled length) would "
                  "make it faster.")
    elif streamed > 0.5 * res.copy_gbs:
        limits = (f"our decode step reads the weights at {streamed:.1f} GB/s, near the host's "
                  f"{res.copy_gbs:.1f} GB/s copy bandwidth, so it is memory-bound; only smaller weights "
                  "(bf16) would make it faster.")
    else:
        limits = (f"our decode step moves the weights at only {streamed:.1f} GB/s of the host's "
                  f"{res.copy_gbs:.1f} GB/s copy bandwidth"
                  + (f" ({rate:.1f} GB/s with the KV cache, against the {res.stream_gbs:.1f} GB/s a "
                     f"{res.batch}-row matmul streams)" if rate > 0 and not math.isnan(res.stream_gbs) else "")
                  + ": per-step work beyond streaming the weights (attention over the whole cache, "
                  "softmax, cache writes, norms) and CPU time taken by other processes on these 2 shared "
                  "cores (see the spread of the repeats) make up the rest.")
    need_ms = step_h / 3
    if step_o > 0 and not math.isnan(res.gemm_gflops):  # the roofline was measured
        need = res.step_gflop / (need_ms / 1e3)
        limits += (f" Compute: a decode step is {res.step_gflop:.2f} GFLOP ({res.batch} rows through every "
                   f"matmul); ours runs it at {res.step_gflop / (step_o / 1e3):.0f} GFLOP/s, transformers at "
                   f"{res.step_gflop / (step_h / 1e3):.0f}. A 3x decode step ({need_ms:.1f} ms) needs {need:.0f} "
                   f"GFLOP/s: {need / res.gemm_gflops:.1f}x what XLA's fp32 matmul reaches at the step's own "
                   f"[{res.batch} x {res.size.hidden}] @ [{res.size.hidden} x {res.size.mlp}] shape "
                   f"({res.gemm_gflops:.0f}) and {need / res.peak_gflops:.1f}x its best at 1024^3 "
                   f"({res.peak_gflops:.0f})" + (" -- out of reach on this machine at fp32 for any sampler."
                                                 if need > res.peak_gflops else "."))
    if step_o > 0 and not math.isnan(res.stream_gbs):
        limits += (f" Memory: a step reads at least {res.step_bytes / 1e6:.0f} MB (weights and the KV cache); at the "
                   f"{res.stream_gbs:.1f} GB/s a {res.batch}-row matmul streams weights on this machine no step is "
                   f"faster than {res.floor_ms:.1f} ms, so at most {step_h / res.floor_ms:.1f}x transformers' step "
                   f"is reachable here at fp32 (ours is {res.floor_ms / step_o:.2f} of the way: {step_o:.1f} ms)"
                   + (f"; the 3x step ({need_ms:.1f} ms) is below that floor." if need_ms < res.floor_ms else "."))
    if step_o > 0 and not math.isnan(res.step_stream_gbs):
        dots = 7 * res.size.layers + 1
        limits += (f" Our step's weight matmuls alone, as the loop multiplies them ({dots} dots, one a weight, "
                   f"layer after layer), take {res.matmuls_ms:.1f} ms: {res.step_stream_gbs:.1f} GB/s, slower "
                   f"than the one large matmul; the other {step_o - res.matmuls_ms:.1f} ms of our step are "
                   "attention over the whole cache, the softmax and argmax over the vocabulary, cache writes, "
                   "norms and the loop's per-op overhead.")
    if step_o > 0 and step_h >= step_o:
        where = (f"The gain is in the decode step ({step} faster: the whole loop is one XLA `while_loop` with "
                 "the KV cache updated in place and each matmul a YNNPACK dot on out-major weights, against "
                 "per-op PyTorch dispatch and a growing cache per step)")
    else:
        where = (f"Our decode step is the slower one ({step} of transformers' speed: inside the layer scan "
                 "XLA:CPU copies each layer's weights out of the stacked arrays every step before the matmuls "
                 "read them)")
    return (f"{verdict} the 3x target ({ratio:.2f}x). {where}; the prefill (all prompt tokens in one pass) "
            f"differs by {pre_h / pre_o:.2f}x, and decode is {100 * decode_share:.0f}% of our time. Limits: {limits}")



def render_sampling_gpu(res: SamplingResult, command: str, info: dict[str, str], allow_load: bool = False) -> str:
    """The GPU section (`sampling_gpu`): the same comparison with both sides on the GPU, plus the sampler
    with its layers unstacked; no host roofline (it says nothing about a GPU)."""
    refusal = ratio_refusal(list(res.loads), allow_load)
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    cols = [("ours", res.ours_s, res.ours_prefill_s, res.ours_first_s),
            ("unstacked", res.unstacked_s, res.unstacked_prefill_s, res.unstacked_first_s),
            ("transformers", res.hf_s, res.hf_prefill_s, res.hf_first_s)]
    cols = [c for c in cols if c[1]]
    med = {k: statistics.median(xs) for k, xs, _, _ in cols}
    step = {k: res.step_ms(xs, ps) for k, xs, ps, _ in cols}
    row = lambda label, f: f"| {label} | " + " | ".join(f(*c) for c in cols) + " |"
    names = {"ours": "dlr_jax Sampler (default on GPU: layer scan)",
             "unstacked": "dlr_jax Sampler, `unstack_layers=True`", "transformers": "transformers generate (PyTorch)"}
    lines = header("Greedy sampling on a GPU: dlr_jax.generate.sampler vs transformers generate", command, info) + [
        f"Model: random Llama, {res.size.describe()}; fp32 on both sides, matmuls in full fp32 (no TF32: "
        "PyTorch's default, and JAX's `default_matmul_precision('float32')`); the same weights on both sides (HF "
        f"model saved, then imported with `dlr_jax.convert.load_hf`). Batch {res.batch} prompts x {res.prompt_len} "
        f"tokens, {res.new_tokens} new tokens each, greedy, no EOS stop ({res.tokens} generated tokens per call). "
        "Time per call = prefill + decode, tokens back on the host. Median of "
        f"{res.repeats} repeats after one warm-up call; all sides in one process, repeats interleaved.",
        "",
        "| | " + " | ".join(names[c[0]] for c in cols) + " |",
        "|---|" + "---|" * len(cols),
        row("tokens/s (median)", lambda k, *_: f"{res.tokens / med[k]:,.0f}"),
        row("seconds per call (median)", lambda k, *_: f"{med[k]:.3f}"),
        row("seconds per call (all repeats)", lambda k, xs, *_: fmt(xs)),
        row("first call (compile + run) s", lambda k, xs, ps, first: f"{first:.2f}"),
        row("prefill call (1 new token) s, median", lambda k, xs, ps, first: f"{statistics.median(ps):.4f}"),
        row(f"decode step ms ((call - prefill call) / {res.new_tokens - 1})", lambda k, *_: f"{step[k]:.2f}"),
        row("parameter bytes / decode step, GB/s",
            lambda k, *_: f"{res.param_bytes / (step[k] * 1e6):.0f}" if step[k] > 0 else "n/a"),
        "",
    ]
    same = (f"Greedy tokens identical to transformers' at {100 * res.identical_frac:.1f}% of positions; "
            f"{res.identical_rows}/{res.batch} rows identical throughout; mean common prefix "
            f"{res.mean_common_prefix:.1f}/{res.new_tokens} tokens"
            + (" (once a near-tie flips a token, the rest of that row follows a different prefix)"
               if res.identical_rows < res.batch else "")
            + (f"; the unstacked sampler's tokens equal the default's at {100 * res.unstacked_identical_frac:.1f}% "
               "of positions." if res.unstacked_s else "."))
    if refusal:
        return "\n".join(lines + [same, "", f"Speed-up {refusal} (load average before the benchmark: "
                                           f"{res.loads[0]:.2f})."]) + "\n"
    ratio = med["transformers"] / med["ours"]
    verdict = "meets" if ratio >= 3 else "misses"
    pre = {k: statistics.median(ps) for k, _, ps, _ in cols}
    where = (f"decode step {step['ours']:.2f} ms against transformers' {step['transformers']:.2f} ms "
             f"({step['transformers'] / step['ours']:.1f}x), prefill call {pre['transformers'] / pre['ours']:.1f}x"
             if step["ours"] > 0 else "the decode step rounds to nothing at this size")
    text = [f"Speed-up: **{ratio:.2f}x** (target >= 3x; {verdict} it). {same}", "",
            f"Where it comes from: {where}. Our whole decode loop is one compiled XLA `while_loop` on the device; "
            "`generate` launches every op of every token from Python, so at this size its step is bound by "
            "launch and dispatch overhead, not by the GPU."]
    if res.unstacked_s and step.get("unstacked", 0) > 0 and step["ours"] > 0:
        faster = step["ours"] / step["unstacked"]
        text.append(f"Layers unstacked (`sampling.unstack_layers=on`; the default on CPUs): decode step "
                    f"{step['unstacked']:.2f} ms, {faster:.2f}x the layer scan's; first call "
                    f"{res.unstacked_first_s:.1f} s against {res.ours_first_s:.1f} s (every layer is compiled on "
                    "its own), and a second copy of the weights while a call runs. "
                    + ("Worth turning on only where decoding outweighs the extra compile and memory; the GPU "
                       "default stays the scan." if faster > 1.1 else
                       "No reason to turn it on here: the scan (the GPU default) is as fast."))
    return "\n".join(lines + text) + "\n"
