"""Scratch measurement behind BENCHMARKS.md's sampling notes of 2026-11-28 (23:58 UTC): where the CPU decode loop's op
time goes, grouped by the jax op each XLA op came from (weight matmuls by their result shape). The medium bench
model, batch 16, a 64-token prompt, 128 new tokens, a cache of 192 slots; one traced call after a warm-up call.

    cd /tmp && PYTHONPATH=/path/to/checkout python decode_op_profile.py

2-core Intel Xeon host, idle, 2026-11-28 23:58 UTC, commit 5c8ac6d; op time a step (summed over both threads:
24.0 ms, against a wall-clock step of 16-18 ms; the ops the loop's HLO does not name, ~2 ms, are the prefill's, the
per-call weight copies, spread over the 127 steps, and a few of the loop's reductions):

| ops | ms a step | share | bytes read a step | GB/s of op time |
|---|---|---|---|---|
| gate and up projections (`f32[1536,16]`, 16 dots) | 7.03 | 29 % | 50 MB | 7.2 |
| q, o and down projections (`f32[512,16]`, 24 dots) | 4.54 | 19 % | 42 MB | 9.2 |
| k and v projections (`f32[256,16]`, 16 dots) | 1.42 | 6 % | 8 MB | 5.9 |
| the head (`f32[8192,16]`) | 1.24 | 5 % | 17 MB | 13.5 |
| attention scores (q @ K^T) | 3.14 | 13 % | 25 MB | 8.0 |
| attention P @ V | 1.86 | 8 % | 25 MB | 13.5 |
| everything else (norms, RoPE, softmax, cache writes, argmax, log-softmax, and the unnamed ops) | 4.8 | 20 % | | |
"""

import collections
import gzip
import json
import os
import tempfile
from pathlib import Path

dump = tempfile.mkdtemp()
os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} " + os.environ.get("XLA_FLAGS", "")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from dlr_jax.bench.common import SIZES, model_config  # noqa: E402
from dlr_jax.bench.op_profile import hlo_op_names  # noqa: E402
from dlr_jax.models.transformer import Transformer  # noqa: E402
from dlr_jax.sampling import Sampler  # noqa: E402

size, new = SIZES["medium"], 128
model = Transformer(model_config(size), rngs=nnx.Rngs(0))
prompts = np.random.default_rng(0).integers(1, size.vocab, (16, 64)).astype(np.int32)
sampler = Sampler(model, prompt_bucket=64, max_total_len=64 + new)
sampler.generate(prompts, max_new_tokens=new, temperature=0.0)
trace = tempfile.mkdtemp()
jax.profiler.start_trace(trace)
sampler.generate(prompts, max_new_tokens=new, temperature=0.0)
jax.profiler.stop_trace()
events = json.loads(gzip.decompress(sorted(Path(trace).rglob("*.trace.json.gz"))[-1].read_bytes()))["traceEvents"]
hlo = next(Path(dump).glob("*decode_loop.cpu_after_optimizations.txt")).read_text()
names = hlo_op_names(hlo)
ms: dict[str, float] = collections.Counter()
for e in events:
    op = (e.get("args") or {}).get("hlo_op")
    if e.get("ph") != "X" or not op or op.split(".")[0] in ("while", "conditional", "call", "wrapped_call"):
        continue
    if op not in names:  # the prefill's ops, the call's weight copies, and loop fusions without an op name
        ms[f"not named: {op.split('.')[0]}"] += e["dur"] / 1e3 / (new - 1)
        continue
    shape, path = names[op]
    key = path.split("/body/")[-1]
    ms[f"weight dot {shape}" if key == "dot_general" else key] += e["dur"] / 1e3 / (new - 1)
total = sum(ms.values())
print(f"op time a step: {total:.2f} ms")
for key, t in ms.most_common(20):
    print(f"{t:7.3f} ms {100 * t / total:5.1f} %  {key}")
