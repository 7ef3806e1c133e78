"""Scratch measurement behind BENCHMARKS.md's sampling notes of 2026-11-28 (23:35 UTC): the decode step's attention
alone, 8 layers' caches of the medium bench model (batch 16, 4 KV heads x 2 query heads, 192 slots, head_dim 64:
50 MB of K and V), one new token written into each cache per step, in a `fori_loop` of 128 steps compiled with the
decode loop's options (`sampling.CPU_DECODE_OPTIONS`). Two forms of the scores:

- `q_lhs` (the model's form): scores = q @ K^T, [b, kv, g, d] x [b, kv, s, d] -> [b, kv, g, s];
- `k_lhs`: scores^T = K @ q^T -> [b, kv, s, g], the cache the dot's left operand (an optimization barrier keeps
  XLA from swapping the operands back), transposed after.

    cd /tmp && PYTHONPATH=/path/to/checkout python decode_attention_forms.py

2-core Intel Xeon host, idle, 2026-11-28 23:35 UTC: q_lhs 4.91 ms, k_lhs 3.01 ms a step (5 alternated rounds,
medians). Inside the decode loop the same change made no difference (see BENCHMARKS.md): there the scores dot took
3.26 ms (k_lhs) against 3.25 ms (q_lhs) of op time a step, and the step 15.4-17.1 against 16.0-17.0 ms, paired
in separate processes. Alone, the 50 MB of caches stay in the host's 260 MB L3; in the decode loop they share it
with 117 MB of weights, and both forms wait on memory.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from dlr_jax.sampling import CPU_DECODE_OPTIONS

b, kv, g, s, hd, layers, steps = 16, 4, 2, 192, 64, 8, 128
rng = np.random.default_rng(0)
K0 = [jnp.asarray(rng.standard_normal((b, kv, s, hd), np.float32)) for _ in range(layers)]
V0 = [jnp.asarray(rng.standard_normal((b, kv, s, hd), np.float32)) for _ in range(layers)]
q0 = jnp.asarray(rng.standard_normal((b, kv, g, hd), np.float32))


def q_lhs(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bkgd,bksd->bkgs", q, k) / 8.0, -1)
    return jnp.einsum("bkgs,bksd->bkgd", p, v)


def k_lhs(q, k, v):
    scores = jnp.einsum("bksd,bkgd->bksg", k, q) / 8.0
    p = jax.nn.softmax(jax.lax.optimization_barrier(scores).swapaxes(-1, -2), -1)
    return jnp.einsum("bkgs,bksd->bkgd", p, v)


def compiled(attend):
    def run(q, ks, vs):
        def body(i, carry):
            x, ks, vs = carry
            new_k, new_v = [], []
            for k, v in zip(ks, vs, strict=True):
                new = x[:, :, :1, :] * 0.5
                k = jax.lax.dynamic_update_slice(k, new, (0, 0, i, 0))
                v = jax.lax.dynamic_update_slice(v, new * 2, (0, 0, i, 0))
                new_k.append(k)
                new_v.append(v)
                x = x + 1e-3 * attend(x, k, v)
            return x, new_k, new_v
        return jax.lax.fori_loop(0, steps, body, (q, ks, vs))[0]
    return jax.jit(run).lower(q0, K0, V0).compile(dict(CPU_DECODE_OPTIONS))


forms = {"q_lhs": compiled(q_lhs), "k_lhs": compiled(k_lhs)}
ms: dict[str, list[float]] = {name: [] for name in forms}
for _ in range(5):
    for name, fn in forms.items():
        t = time.perf_counter()
        fn(q0, K0, V0).block_until_ready()
        ms[name].append(1e3 * (time.perf_counter() - t) / steps)
for name, xs in ms.items():
    print(f"{name}: {np.median(xs):.2f} ms a step ({' '.join(f'{x:.2f}' for x in xs)})")
