import jax, jax.numpy as jnp, sys
from pathlib import Path
from jax.experimental import topologies
from dlr_jax.plan.targets import SPECS
import dlr_jax.plan.targets as T
print([t for t in dir(T) if t.isupper()])
spec_file = [p for p in SPECS.iterdir() if "h100" in p.name.lower()][0]
topo = topologies.get_topology_desc(platform="cuda", target_config=spec_file.read_text(), topology="1x1x8")
dev = topo.devices[0]
from jax.sharding import SingleDeviceSharding
def f(x, w, k):
    y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (y.reshape(-1, y.shape[-1]) @ w).sum()
g = jax.jit(jax.grad(f, argnums=(1, 2)))
s = SingleDeviceSharding(dev)
args = [jax.ShapeDtypeStruct((4, 64, 64, 96), jnp.bfloat16, sharding=s), jax.ShapeDtypeStruct((96, 200), jnp.bfloat16, sharding=s), jax.ShapeDtypeStruct((3, 3, 96, 96), jnp.bfloat16, sharding=s)]
low = g.lower(*args)
for opts in ({}, {"xla_gpu_enable_triton_gemm": False}, {"xla_gpu_enable_triton_gemm": False, "xla_gpu_autotune_level": 0}):
    try:
        c = low.compile(compiler_options=opts); print("OK", opts, c.memory_analysis().temp_size_in_bytes)
    except Exception as e:
        print("FAIL", opts, str(e).splitlines()[0][:300])
