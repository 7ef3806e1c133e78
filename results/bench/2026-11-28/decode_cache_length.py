"""Scratch measurement behind BENCHMARKS.md's sampling notes of 2026-11-28: the CPU decode step's time against the
length of the fixed-shape KV cache the loop attends over (the medium bench model, batch 16, a 64-token prompt,
64 new tokens; step = (64-token call - 1-token call) / 63, three rounds, samplers alternated).

    cd /tmp && PYTHONPATH=/path/to/checkout python results/bench/2026-11-28/decode_cache_length.py

2-core Intel Xeon host, idle, 2026-11-28 21:58 UTC, commit 53839f9, ms a step per round:

| cache slots | step ms |
|---|---|
| 128 | 15.1, 15.0, 15.0 |
| 192 | 17.5, 17.2, 16.7 |
| 320 | 21.0, 20.9, 20.7 |

This file, rerun at 22:00 UTC: 128 slots 15.6, 14.9, 15.4; 192 slots 17.2, 17.2, 17.1; 320 slots 20.8, 22.1, 21.4.
"""

import time

import numpy as np
from flax import nnx

from dlr_jax.bench.common import SIZES, model_config
from dlr_jax.models.transformer import Transformer
from dlr_jax.sampling import Sampler

size = SIZES["medium"]
model = Transformer(model_config(size), rngs=nnx.Rngs(0))
prompts = np.random.default_rng(0).integers(1, size.vocab, (16, 64)).astype(np.int32)
samplers = {slots: Sampler(model, prompt_bucket=64, max_total_len=slots) for slots in (128, 192, 320)}


def call(s: Sampler, n: int) -> float:
    t = time.perf_counter()
    s.generate(prompts, max_new_tokens=n, temperature=0.0)
    return time.perf_counter() - t


for s in samplers.values():  # compile both variants
    call(s, 64)
    call(s, 1)
steps: dict[int, list[float]] = {slots: [] for slots in samplers}
for _ in range(3):
    for slots, s in samplers.items():
        steps[slots].append(1e3 * (call(s, 64) - call(s, 1)) / 63)
for slots, ms in steps.items():
    print(slots, " ".join(f"{x:.1f}" for x in ms))
