"""How close a GRPO update runs to this host's matrix-multiply rate (grpo_peers' "where the time
goes"): the update's FLOPs counted analytically, and fp32 GEMM GFLOP/s under XLA and torch measured in
the same run, at the threads the workers use."""

from __future__ import annotations

import time
import types

import numpy as np

from dlr_jax.bench import common
from dlr_jax.plan_flops import dense_lm_flops


def update_flops(size: common.Size, sequences: int, seq_len: int) -> float:
    """FLOPs of one optimizer step's forward + backward over `sequences` rows of `seq_len` tokens (the
    teacher-forced policy pass every framework's GRPO loss needs; the optimizer's own FLOPs are negligible)."""
    cfg = types.SimpleNamespace(hidden_size=size.hidden, head_dim=size.hidden // size.heads, num_heads=size.heads,
                                num_kv_heads=size.kv_heads, intermediate_size=size.mlp, num_layers=size.layers,
                                vocab_size=size.vocab)
    return dense_lm_flops(cfg, sequences * seq_len, seq_len)


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def gemm_rates(n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """fp32 [n, n] x [n, n] GFLOP/s: {"XLA": ..., "torch": ...} (torch left out where it is not installed)."""
    import jax
    import jax.numpy as jnp

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    flops = 2.0 * n**3
    x = jax.device_put(a, jax.devices("cpu")[0])  # the host's rate, even where a GPU is the default device
    dot = jax.jit(jnp.dot)
    out = {"XLA": flops / _median_seconds(lambda: dot(x, x).block_until_ready(), repeats) / 1e9}
    try:
        import torch
    except ImportError:
        return out
    threads = torch.get_num_threads()
    torch.set_num_threads(common.cpu_threads())  # as the TRL worker runs
    try:
        t = torch.from_numpy(a)
        out["torch"] = flops / _median_seconds(lambda: torch.mm(t, t), repeats) / 1e9
    finally:
        torch.set_num_threads(threads)
    return out
