"""The same small fp32 program compiled at the default LLVM level and at --xla_backend_optimization_level=0:
how far apart the results are (tests/xla_env.py). Run: python opt_level_numerics.py (it starts both levels)."""

import os
import subprocess
import sys

PROGRAM = """
import sys, numpy as np, jax, jax.numpy as jnp
x = jax.random.normal(jax.random.key(0), (64, 1000)); w = jax.random.normal(jax.random.key(1), (1000, 300))
f = jax.jit(lambda x, w: (jax.nn.softmax(jnp.tanh(x) @ w, -1).sum(0), jnp.exp(x).mean(1), jax.nn.silu(x).var(0),
                          jax.grad(lambda w: jnp.sum(jnp.log1p(jnp.abs(x @ w))))(w)))
np.savez(sys.argv[1], *[np.asarray(a) for a in f(x, w)])
"""

if __name__ == "__main__":
    import numpy as np

    runs = {}
    for name, flags in (("default", ""), ("O0", "--xla_backend_optimization_level=0")):
        out = f"/tmp/opt_level_{name}.npz"
        subprocess.run([sys.executable, "-c", PROGRAM, out], check=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags))
        runs[name] = np.load(out)
    labels = ("softmax row sums", "exp mean", "silu var", "grad of a matmul loss")
    for k, label in zip(runs["default"], labels, strict=True):
        a, b = runs["default"][k], runs["O0"][k]
        print(f"{label:24s} identical={np.array_equal(a, b)} max |diff| {np.abs(a - b).max():.2e} "
              f"(max |value| {np.abs(a).max():.2e})")
