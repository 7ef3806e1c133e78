"""TPU splash attention (the Pallas kernel JAX ships in `jax.experimental.pallas.ops.tpu`) for the
backbone's causal attention within packed segments (issue 19, item 6).

Why: on TPU the XLA einsum path materialises [b, kv, g, t, s] fp32 scores per layer (and keeps them for
the backward); the kernel streams blocks of K/V through VMEM and never stores the scores. It covers
the layout training and scoring use — self-attention over whole sequences, causal within
`segment_ids` (0 = padding) — and is selected for it only; decode steps (one query against a cache)
stay on XLA.

A Pallas kernel is opaque to XLA's SPMD partitioner (it would gather its operands onto every device),
so it runs under `shard_map`: batch split like the activations, heads split over "tensor" when both
the query and the KV heads divide (grouped-query heads must stay with their KV head). Off TPU the same
kernel runs in Pallas interpret mode: slow, but the exact algorithm, which is how CPU tests check it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int

from dlr_jax.core.sharding import active_rules, get_abstract_mesh, logical_to_spec

BLOCK = 128  # the kernel's default block sizes; a sequence must be a whole number of blocks


def splash_fits(t: int, s: int) -> bool:
    """Whether a [t queries x s keys] self-attention has the shape the kernel takes."""
    return t == s and t % BLOCK == 0


def _local_attention(q, k, v, segment_ids, *, interpret: bool):
    """Unsharded: q [b, t, h, hd] (already scaled), k/v [b, t, kv, hd], segment_ids [b, t]."""
    t, h = q.shape[1], q.shape[2]
    mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(h)])
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, interpret=interpret)

    def one(qi, ki, vi, si):  # one sequence: the kernel takes heads first
        heads_first = lambda x: jnp.swapaxes(x, 0, 1)
        out = kernel(heads_first(qi), heads_first(ki), heads_first(vi), segment_ids=sk.SegmentIds(si, si))
        return heads_first(out)

    return jax.vmap(one)(q, k, v, segment_ids)


def splash_attention(
    q: Float[Array, "b t h hd"],
    k: Float[Array, "b t kv hd"],
    v: Float[Array, "b t kv hd"],
    segment_ids: Int[Array, "b t"],
    *,
    interpret: bool = False,
) -> Float[Array, "b t h hd"]:
    """Causal attention within segments with the splash kernel; the same maths as
    `attention.attention` with `causal_mask(segment_ids)` at every real (segment != 0) position."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    q = q * jnp.asarray(1.0 / math.sqrt(hd), q.dtype)  # the kernel does not scale the logits
    segment_ids = segment_ids.astype(jnp.int32)
    mesh = get_abstract_mesh()
    run = lambda *a: _local_attention(*a, interpret=interpret)
    if mesh is None or mesh.empty or mesh.size == 1:
        return run(q, k, v, segment_ids)
    batch = logical_to_spec(("batch",), (b,), mesh, active_rules())[0]
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and h % tensor == 0 and kv % tensor == 0 else None
    qs, ss = PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
    return jax.shard_map(run, mesh=mesh, in_specs=(qs, qs, qs, ss), out_specs=qs, check_vma=False)(
        q, k, v, segment_ids
    )
