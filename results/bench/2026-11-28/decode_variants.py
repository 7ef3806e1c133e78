"""Scratch measurement behind BENCHMARKS.md's sampling notes of 2026-11-28 (23:40-23:57 UTC): the CPU decode step
of the medium bench model under variants of dtype and device layout (greedy, a 64-token prompt; step = (N-token call
- 1-token call) / (N - 1), three rounds after a warm-up). The greedy tokens are saved to OUT.npy to compare variants.

    cd /tmp && PYTHONPATH=/path/to/checkout python decode_variants.py VARIANT OUT [BATCH NEW]

VARIANT: `one` (one device, the default Sampler), `bf16` (weights and cache in bf16), `data2` or `tensor2` (the model
on a ("data", "fsdp", "tensor") mesh of 2 CPU devices, batch-split or tensor-parallel; run with
`XLA_FLAGS=--xla_force_host_platform_device_count=2`), `tensor4` / `data2tensor2` (4 devices on the 2 cores).
`one` under `taskset -c 0` is the step on one core.

2-core Intel Xeon host, idle, 2026-11-28 23:40-23:57 UTC, commit 5c8ac6d, ms a step per round (variants alternated
in separate processes; see BENCHMARKS.md for the runs):

| variant | batch 16, 128 new | batch 64, 64 new | greedy tokens vs `one` |
|---|---|---|---|
| `one` (the default) | 17.9 17.8 18.7; 17.9 17.8 17.6 | 40.5 40.5 40.4; 40.4 40.3 41.2 | (itself) |
| `one` on one core (`taskset -c 0`) | 22.8 22.7 22.8; 22.9 22.9 23.0 | | 100 % of positions |
| `bf16` | 18.3 18.1 18.3; 18.7 19.0 18.9 | | 64.6 % of positions, mean common prefix 48.4 of 128 |
| `data2` | 16.3 17.4 17.3; 16.5 17.4 16.9 | | 100 % |
| `tensor2` | 14.2 16.2 14.5; 14.3 15.0 14.9 | 31.5 32.0 31.6; 31.3 32.3 30.9 | 100 % (both shapes) |
| `tensor4` (4 devices) | 26.7 25.6 25.6 | | 100 % |
| `data2tensor2` (4 devices) | 18.0 18.4 18.6 | | 100 % |
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dlr_jax.bench.common import SIZES, model_config
from dlr_jax.models.transformer import Transformer
from dlr_jax.sampling import Sampler
from dlr_jax.sharding import make_mesh, state_shardings

variant, out = sys.argv[1], sys.argv[2]
batch, new = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (16, 128)
size = SIZES["medium"]
model = Transformer(model_config(size), rngs=nnx.Rngs(0))
prompts = np.random.default_rng(0).integers(1, size.vocab, (batch, 64)).astype(np.int32)
graphdef, state = nnx.split(model)
kw: dict = {"prompt_bucket": 64, "max_total_len": 64 + new}
if variant == "bf16":
    state = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.ndim >= 2 else x, state)
    kw["cache_dtype"] = "bfloat16"
elif variant != "one":
    shape = {"data2": (2, 1, 1), "tensor2": (1, 1, 2), "tensor4": (1, 1, 4), "data2tensor2": (2, 1, 2)}[variant]
    mesh = make_mesh(*shape)
    rules = "tp" if shape[2] > 1 else "fsdp"
    state = jax.device_put(state, state_shardings(state, mesh, rules))
    kw.update(mesh=mesh, rules=rules)
sampler = Sampler((graphdef, state), **kw)


def call(n: int):
    t = time.perf_counter()
    res = sampler.generate(prompts, max_new_tokens=n, temperature=0.0)
    return time.perf_counter() - t, res


call(new)
call(1)
steps = []
for _ in range(3):
    long, res = call(new)
    short, _ = call(1)
    steps.append(1e3 * (long - short) / (new - 1))
np.save(out, res.tokens)
print(variant, batch, new, " ".join(f"{x:.1f}" for x in steps), flush=True)
