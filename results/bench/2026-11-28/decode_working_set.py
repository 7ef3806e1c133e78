"""Scratch microbenchmark behind BENCHMARKS.md's sampling notes of 2026-11-28 (21:00 UTC): how fast 16-row
gate/up products stream their weights as the number of layers (the working set) grows, in four forms, with
the CPU decode loop's compiler options (`sampling.CPU_DECODE_OPTIONS`).

    cd /tmp && PYTHONPATH=/path/to/checkout python results/bench/2026-11-28/decode_working_set.py 8   # then 16, 27

2-core Intel Xeon host (260 MB shared L3), idle, 2026-11-28 ~21:00 UTC, GB/s of weights:

| layers (MB of gate/up weights) | A out-major | B row-major | C gate+up fused | D down-shaped |
|---|---|---|---|---|
| 8 (50) | 29.6 | 22.5 | 26.6 | 19.4 |
| 16 (101) | 18.7 | 15.7 | 13.0 | 14.5 |
| 27 (170) | 11.8 | 12.9 | 11.8 | 12.6 |

This file, rerun at 21:40 UTC: 8 layers 29.2 / 22.3 / 27.6 / 19.1, 27 layers 12.5 / 13.4 / 11.6 / 12.7 GB/s.
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dlr_jax.sampling import CPU_DECODE_OPTIONS

LAYERS, D, F, B = int(sys.argv[1]), 512, 1536, 16
STEPS = 50
rs = np.random.default_rng(0)
bar = jax.lax.optimization_barrier


def best_seconds(f, *args, repeats=5):
    c = jax.jit(f).lower(*args).compile(compiler_options=CPU_DECODE_OPTIONS)
    c(*args).block_until_ready()
    best = 1e9
    for _ in range(repeats):
        t = time.perf_counter()
        c(*args).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return best


def loop(step):
    """STEPS iterations of `step`, each feeding the next (nothing hoisted)."""
    return lambda ws, x: jax.lax.fori_loop(0, STEPS, lambda _, x: step(ws, x), x)


def weight(*shape):
    return jnp.asarray(rs.standard_normal(shape) * 0.02, jnp.float32)


gate = [weight(F, D) for _ in range(LAYERS)]  # out-major
up = [weight(F, D) for _ in range(LAYERS)]


def out_major(ws, x):  # A: [F, D] @ [D, 16] each
    for g, u in zip(*ws, strict=True):
        xt = bar(x.T)
        x = x + (bar(jnp.dot(g, xt)) * bar(jnp.dot(u, xt))).T[:, :D] * 1e-3
    return x


def row_major(ws, x):  # B: [16, D] @ [D, F] each
    for g, u in zip(*ws, strict=True):
        x = x + ((x @ g) * (x @ u))[:, :D] * 1e-3
    return x


def fused(ws, x):  # C: gate and up as one [2F, D] out-major weight
    for w in ws:
        y = bar(jnp.dot(w, bar(x.T)))
        x = x + (y[:F] * y[F:]).T[:, :D] * 1e-3
    return x


def down_shaped(ws, x):  # D: the same bytes as [D, F] @ [F, 16] (a long contraction)
    for w in ws:
        x = x + bar(jnp.dot(w, bar(jnp.tile(x, (1, 3)).T))).T * 1e-3
    return x


x0 = jnp.asarray(rs.standard_normal((B, D)), jnp.float32)
cases = {
    "A out-major gate/up": (out_major, (gate, up)),
    "B row-major": (row_major, ([g.T.copy() for g in gate], [u.T.copy() for u in up])),
    "C fused out-major": (fused, [jnp.concatenate([g, u], 0) for g, u in zip(gate, up, strict=True)]),
    "D down-shaped out-major": (down_shaped, [weight(D, F) for _ in range(2 * LAYERS)]),
}
nbytes = 2 * LAYERS * F * D * 4
for name, (step, ws) in cases.items():
    t = best_seconds(loop(step), ws, x0)
    print(f"{name:28s} {1e3 * t / STEPS:.3f} ms/iter  {nbytes * STEPS / t / 1e9:.1f} GB/s")
