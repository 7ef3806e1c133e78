"""Looking up rows of a vocabulary table without gathering the table onto every device.

A token-embedding table has the logical axes ("vocab", "embed"); the rules split "vocab" over "tensor"
(and, under FSDP, "embed" over "fsdp"). The lookup used to view the table as split on its embed dim
only, because SPMD's own partitioning of a gather depends on the operand's and the indices' layouts
and had fallen back to full rematerialisation for a table split on both dims. On the sampling copy's
tensor-parallel layout that view all-gathered the whole table onto every device for every rollout
call: the full bf16 table (~1 GB for Llama-3's 128k x 4096, 2 GB at 8192), the very thing splitting it
was for. So the vocabulary split is written out here instead of left to the partitioner.

So where "vocab" is split n ways the lookup is vocabulary-parallel: the table is viewed as
[n, V / n, d] (a free reshape: the split dim becomes dim 0), every shard looks up each id's local row
(id mod V / n) in its own slice, the rows of shards that do not own the id are zeroed, and the sum
over shards (an all-reduce of [..., d], the size of the output) leaves each id's one true row. The sum
adds zeros to one row, so the result is the plain lookup bit for bit; its gradient scatters into each
device's own slice.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from dlr_jax.sharding import active_rules, constrain, get_abstract_mesh, logical_to_spec

TABLE_AXES = ("vocab", "embed")


def vocab_split(table_shape: tuple[int, int]) -> int:
    """How many ways the active mesh and rules split a [V, d] table's vocab dim (1: not split)."""
    mesh = get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.size == 1:
        return 1
    axis = logical_to_spec(TABLE_AXES, table_shape, mesh, active_rules())[0]
    names = (axis,) if isinstance(axis, str) else tuple(axis or ())
    return math.prod(mesh.shape[a] for a in names)


def embed_split(table_shape: tuple[int, int]) -> bool:
    """Whether the active rules split a [V, d] table's embed dim (FSDP) on the active mesh."""
    mesh = get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.size == 1:
        return False
    return logical_to_spec(TABLE_AXES, table_shape, mesh, active_rules())[1] is not None


def lookup_rows(table: Float[Array, "v d"], ids: Int[Array, "b t"]) -> Float[Array, "b t d"]:
    """`table[ids]` for a ("vocab", "embed") table (ids in [0, V)), in the table's dtype, without a
    whole-table copy on any device; the result is constrained to ("batch", "length", "act_embed").

    Where "embed" is split (FSDP), every device looks up every id for its own columns (ids replicated:
    they are small); otherwise each device looks up its own batch rows."""
    v, d = table.shape
    cols = embed_split((v, d))
    id_axes = (None, None) if cols else ("batch", "length")
    n = vocab_split((v, d))
    if n == 1:
        # A table split only on its embed dim: a gather from a table split on both dims makes SPMD
        # fall back to full rematerialisation.
        rows = jnp.take(constrain(table, (None, "embed")), constrain(ids, id_axes), axis=0)
        rows = constrain(rows, (*id_axes, "embed"))
    else:
        local = v // n
        shards = constrain(table.reshape(n, local, d), ("vocab", None, "embed"))
        ids = constrain(ids, id_axes)
        picked = jnp.take(shards, ids % local, axis=1)  # [n, b, t, d]: each shard's row for every id
        picked = constrain(picked, ("vocab", *id_axes, "embed"))
        owner = (ids // local)[None] == jnp.arange(n, dtype=ids.dtype).reshape(n, *(1,) * ids.ndim)
        rows = jnp.where(owner[..., None], picked, jnp.zeros((), table.dtype)).sum(axis=0)
        rows = constrain(rows, (*id_axes, "embed"))
    return constrain(rows, ("batch", "length", "act_embed"))

