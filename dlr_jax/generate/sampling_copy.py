"""The policy's sampling copy: the weights rollouts decode with, in the compute dtype and laid out for
decoding (issue 19, item 5).

Why a copy: decoding with the training layout (FSDP shards the `embed` dim of every matrix) makes the
decode loop all-gather every layer's weights for every generated token: about 15 GB per device per
token for an 8B model, where the token itself needs a few MB. A tensor-parallel layout over one
process's devices (heads, MLP and vocabulary split over "tensor", replicated over "data") reads local
weights only. The copy also holds the weights in the model's compute dtype (bf16 in the paper recipe):
every use in the forward casts a weight to that dtype first, so the copy decodes and scores exactly as
the fp32 master weights do, with half the bytes read per token and half the memory.

It is refreshed after every GRPO step on device: a jitted cast on the training layout, then a
device-to-device reshard (`jax.device_put` between shardings); nothing goes through the host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import ModelConfig
from dlr_jax.core.sharding import make_mesh, parse_mesh_spec, state_shardings

AUTO = "auto"


def auto_sample_shape(mcfg: ModelConfig, vocab_rows: int, n_devices: int, local_devices: int) -> dict[str, int]:
    """The decoding layout `rl.sample_mesh=auto` picks: "tensor" = the largest divisor of one process's
    device count that splits the query heads, the KV heads, the MLP and the vocabulary rows evenly
    (collectives stay inside a node), "data" = the rest. tensor = 1 means replicated weights: a model
    whose heads no device count above 1 divides is decoded data-parallel."""
    dims = (mcfg.num_heads, mcfg.num_kv_heads, mcfg.intermediate_size, vocab_rows)
    tensor = max(t for t in range(1, local_devices + 1)
                 if local_devices % t == 0 and n_devices % t == 0 and all(d % t == 0 for d in dims))
    return {"data": n_devices // tensor, "fsdp": 1, "tensor": tensor}


def sample_mesh_for(spec: str, train_mesh: Mesh, mcfg: ModelConfig | None = None, vocab_rows: int = 0) -> Mesh:
    """`rl.sample_mesh` over the training mesh's devices: "auto" (a decoding layout, see
    `auto_sample_shape`; needs `mcfg` and `vocab_rows`), "" (the training mesh itself: the decode loop
    then gathers FSDP-sharded weights every token) or an explicit "data=2,fsdp=1,tensor=4"."""
    if not spec:
        return train_mesh
    devices = list(train_mesh.devices.flat)
    if spec == AUTO:
        if mcfg is None:
            raise ValueError("rl.sample_mesh=auto needs the model config to choose a layout")
        local = sum(d.process_index == jax.process_index() for d in devices)
        shape = auto_sample_shape(mcfg, vocab_rows, len(devices), local)
    else:
        shape = parse_mesh_spec(spec)
    if math.prod(shape.values()) != len(devices):
        raise ValueError(f"rl.sample_mesh={spec!r} needs {math.prod(shape.values())} devices; the training "
                         f"mesh has {len(devices)}")
    return make_mesh(shape["data"], shape["fsdp"], shape["tensor"], devices=devices)


def copy_dtype(spec: str, mcfg: ModelConfig) -> jnp.dtype | None:
    """`rl.sample_dtype`: "auto" = the model's compute dtype (`model.dtype`), "keep" = the parameters'
    own dtype (no cast: None), or a dtype name."""
    if spec == "keep":
        return None
    return jnp.dtype(mcfg.dtype if spec == AUTO else spec)


class SamplingCopy:
    """Makes the sampling copy of a model state: floating arrays cast to `dtype` (None: kept) on their
    current layout, then moved device to device onto `shardings` (the sampling mesh's layout)."""

    def __init__(self, state: nnx.State, mesh: Mesh, rules: Mapping | str, dtype: jnp.dtype | None):
        self.dtype = dtype
        self.shardings = state_shardings(state, mesh, rules)
        self._cast = jax.jit(self._cast_tree) if dtype is not None else None

    def _cast_tree(self, state: nnx.State) -> nnx.State:
        cast = lambda x: x.astype(self.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        return jax.tree.map(cast, state)

    def __call__(self, state: nnx.State) -> nnx.State:
        if self._cast is not None:
            state = self._cast(state)  # on the training layout: the reshard then moves half the bytes
        return jax.device_put(state, self.shardings)

    def nbytes_per_device(self, state: nnx.State) -> int:
        """Bytes of `state` (a copy this object made) held by this process's first device."""
        dev = jax.local_devices()[0]
        return sum(s.data.nbytes for x in jax.tree.leaves(state) for s in x.addressable_shards if s.device == dev)
