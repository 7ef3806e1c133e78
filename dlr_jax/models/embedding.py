"""Looking up rows of a vocabulary table without gathering the table onto every device.

A token-embedding table has the logical axes ("vocab", "embed"); the rules split "vocab" over "tensor"
(and, under FSDP, "embed" over "fsdp"). The lookup used to view the table as split on its embed dim
only, because SPMD's own partitioning of a gather depends on the operand's and the indices' layouts
and had fallen back to full rematerialisation for a table split on both dims. On the sampling copy's
tensor-parallel layout that view all-gathered the whole table onto every device for every rollout
call: the full bf16 table (~1 GB for Llama-3's 128k x 4096, 2 GB at 8192), the very thing splitting it
was for. So the vocabulary split is written out here instead of left to the partitioner.

Where "vocab" is split n ways the lookup is vocabulary-parallel: the table is viewed as [n, V / n, d]
(a free reshape: the split dim becomes dim 0), every shard looks up each id's local row (id mod V / n)
in its own slice, the rows of shards that do not own the id are zeroed, and the sum over shards (an
all-reduce of the looked-up rows) leaves each id's one true row: the plain lookup, up to the sign of a
zero. Its gradient scatters into each device's own slice.

That all-reduce moves about 2 x (ids a device looks up) x d values, the gather it replaces V x d: a
large training batch (more ids than V / 2 per device, e.g. every id of the global batch where the embed
dim is split) gathers the vocab dim instead, which is then both less traffic and a smaller temporary.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int

from dlr_jax.core.sharding import active_rules, constrain, get_abstract_mesh, logical_to_spec

TABLE_AXES = ("vocab", "embed")


def _spec(axes: tuple[str | None, ...], shape: tuple[int, ...]) -> PartitionSpec | None:
    """The active mesh and rules' spec for an array of `shape` (None without a multi-device mesh)."""
    mesh = get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.size == 1:
        return None
    return logical_to_spec(axes, shape, mesh, active_rules())


def _ways(axis: Any) -> int:
    """How many devices a spec entry splits its dim over."""
    names = (axis,) if isinstance(axis, str) else tuple(axis or ())
    return math.prod(get_abstract_mesh().shape[a] for a in names)


def vocab_parallel(table_shape: tuple[int, int], ids_shape: tuple[int, ...]) -> int:
    """How many vocabulary shards `lookup_rows` looks `ids_shape` ids up in (1: it gathers the vocab dim,
    because the rules do not split it, or because that moves less than an all-reduce of the rows)."""
    spec = _spec(TABLE_AXES, table_shape)
    if spec is None or spec[0] is None:
        return 1
    ids_per_device = math.prod(ids_shape)
    if spec[1] is None:  # ids keep their batch split (see lookup_rows)
        ids_spec = _spec(("batch", "length"), ids_shape)
        ids_per_device //= math.prod(_ways(a) for a in ids_spec)
    return _ways(spec[0]) if 2 * ids_per_device < table_shape[0] else 1


def lookup_rows(
    table: Float[Array, "v d"], ids: Int[Array, "b t"], dtype: Any = None
) -> Float[Array, "b t d"]:
    """`table[ids]` for a ("vocab", "embed") table, cast to `dtype` (default: the table's) before any
    reduction, constrained to ("batch", "length", "act_embed"). Ids outside [0, V) give zero rows.

    Where "embed" is split (FSDP), every device looks up every id for its own columns (the ids are
    replicated: a gather from a table split on both its dims and indices split on another axis is
    what SPMD handled badly); otherwise each device looks up its own batch rows."""
    v, d = table.shape
    dtype = jnp.dtype(table.dtype if dtype is None else dtype)
    spec = _spec(TABLE_AXES, (v, d))
    id_axes = (None, None) if spec is not None and spec[1] is not None else ("batch", "length")
    # One sentinel for every invalid id (take would wrap a negative one): a zero row on both paths.
    ids = constrain(jnp.where((ids >= 0) & (ids < v), ids, v), id_axes)
    n = vocab_parallel((v, d), tuple(ids.shape))
    if n == 1:
        rows = jnp.take(constrain(table, (None, "embed")), ids, axis=0, mode="fill", fill_value=0)
        rows = constrain(rows, (*id_axes, "embed")).astype(dtype)
    else:
        local = v // n
        shards = constrain(table.reshape(n, local, d), ("vocab", None, "embed"))
        picked = jnp.take(shards, ids % local, axis=1).astype(dtype)  # cast first: the sum moves `dtype`
        picked = constrain(picked, ("vocab", *id_axes, "embed"))
        owner = (ids // local)[None] == jnp.arange(n, dtype=ids.dtype).reshape(n, *(1,) * ids.ndim)
        # lax.reduce, not .sum(): jnp upcasts a bf16 sum to fp32, and the all-reduce would move fp32.
        rows = jax.lax.reduce(jnp.where(owner[..., None], picked, jnp.zeros((), dtype)), jnp.zeros((), dtype),
                              jax.lax.add, (0,))
        rows = constrain(rows, (*id_axes, "embed"))
    return constrain(rows, ("batch", "length", "act_embed"))
