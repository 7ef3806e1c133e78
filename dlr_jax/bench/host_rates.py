"""What this host streams and computes, measured in the benchmark's own run: the scale against which a
decode step's time is read (`bench.sampling`). Each is a best-of-repeats rate of one jitted program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dlr_jax.bench.common import Size, timed


def copy_bandwidth_gbs(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best-of-`repeats` host memory copy bandwidth (bytes read + written per second), in GB/s."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch of `dst` pays page faults, not bandwidth
    best = min(timed(lambda: np.copyto(dst, src))[0] for _ in range(repeats))
    return 2 * nbytes / best / 1e9


def xla_matmul_gflops(m: int, k: int, n: int, repeats: int = 20) -> float:
    """Best-of-`repeats` GFLOP/s of one jitted fp32 [m, k] @ [k, n] on this machine, now."""
    rng = np.random.default_rng(0)
    a = jax.device_put(rng.standard_normal((m, k), np.float32))
    b = jax.device_put(rng.standard_normal((k, n), np.float32))
    dot = jax.jit(lambda x, y: x @ y)
    dot(a, b).block_until_ready()
    best = min(timed(lambda: dot(a, b).block_until_ready())[0] for _ in range(repeats))
    return 2 * m * k * n / best / 1e9


def stream_gbs(batch: int, k: int = 1 << 15, n: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` rate (GB/s of weights) of one fp32 projection of `batch` rows by a weight of
    [k, n] (256 MB at the defaults: far larger than the caches) in the form and with the options of the
    sampler's CPU decode loop (an out-major weight, `CPU_DECODE_OPTIONS`): how fast a decode step's
    matmuls can stream weights from memory on this machine."""
    from dlr_jax.generate.sampler import CPU_DECODE_OPTIONS
    from dlr_jax.models.attention import OutMajor, dense

    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((batch, k), np.float32))
    w = jax.device_put(rng.standard_normal((n, k), np.float32))  # out-major: [n, k]
    opts = CPU_DECODE_OPTIONS if jax.default_backend() == "cpu" else None
    dot = jax.jit(lambda a, b: dense(a, OutMajor(b)), compiler_options=opts)
    dot(x, w).block_until_ready()
    best = min(timed(lambda: dot(x, w).block_until_ready())[0] for _ in range(repeats))
    return w.nbytes / best / 1e9


def step_matmuls_gbs(size: Size, batch: int, iters: int = 16, repeats: int = 3, seed: int = 0) -> float:
    """Best-of-`repeats` rate (GB/s of weights) of a decode step's own weight matmuls and nothing else:
    `batch` rows through every layer's q, k, v, o, gate, up and down projections and the untied head,
    each weight distinct and out-major, with `CPU_DECODE_OPTIONS`, `iters` steps in one `fori_loop`.
    Unlike `stream_gbs` (one large matmul) this has the step's many small dots and its weights' working
    set (the KV cache aside), both of which slow a CPU's streaming: how long the step's weight matmuls
    take as the decode loop multiplies them, with nothing else in the step."""
    from dlr_jax.generate.sampler import CPU_DECODE_OPTIONS
    from dlr_jax.models.attention import OutMajor, dense

    d, f, hd = size.hidden, size.mlp, size.hidden // size.heads
    q, kv = size.heads * hd, size.kv_heads * hd
    rng = np.random.default_rng(seed)
    w = lambda *shape: jax.device_put((0.02 * rng.standard_normal(shape)).astype(np.float32))  # noqa: E731
    layers = [{"q": w(q, d), "k": w(kv, d), "v": w(kv, d), "o": w(d, q), "gate": w(f, d), "up": w(f, d),
               "down": w(d, f)} for _ in range(size.layers)]
    weights = (layers, w(size.vocab, d))
    nbytes = sum(x.nbytes for x in jax.tree.leaves(weights))

    def step(ws, x):
        layers, head = ws
        for lw in layers:  # each output feeds the next: nothing is hoisted or dropped
            mm = lambda a, name, lw=lw: dense(a, OutMajor(lw[name]))  # noqa: E731
            kv_sum = mm(x, "k").sum(-1, keepdims=True) + mm(x, "v").sum(-1, keepdims=True)
            x = x + 1e-3 * (mm(mm(x, "q"), "o") + mm(mm(x, "gate") * mm(x, "up"), "down") + kv_sum)
        return x + 1e-6 * dense(x, OutMajor(head)).max(-1, keepdims=True)

    run = jax.jit(lambda ws, x: jax.lax.fori_loop(0, iters, lambda _, x: step(ws, x), x))
    if jax.default_backend() == "cpu":
        run = run.lower(weights, jnp.zeros((batch, d), jnp.float32)).compile(compiler_options=CPU_DECODE_OPTIONS)
    x0 = jax.device_put(rng.standard_normal((batch, d)).astype(np.float32))
    run(weights, x0).block_until_ready()
    best = min(timed(lambda: run(weights, x0).block_until_ready())[0] for _ in range(repeats))
    return nbytes * iters / best / 1e9
