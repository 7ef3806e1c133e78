"""The policy's sampling copy: the decoding layout `rl.sample_mesh=auto` picks, the compute-dtype cast,
per-device bytes, and that the copy decodes and scores as the master weights do."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.core.sharding import create_sharded, make_mesh
from dlr_jax.generate.sampler import Sampler
from dlr_jax.generate.sampling_copy import SamplingCopy, auto_sample_shape, copy_dtype, sample_mesh_for
from dlr_jax.models.transformer import Transformer

LLAMA_8B = ModelConfig(num_heads=32, num_kv_heads=8, intermediate_size=14336, hidden_size=4096, head_dim=128)
TINY = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, dtype="bfloat16")


def test_auto_layout_splits_what_divides_inside_a_process():
    assert auto_sample_shape(LLAMA_8B, 138496, 8, 8) == {"data": 1, "fsdp": 1, "tensor": 8}
    # 2 processes x 4 devices: tensor stays inside a process, data spans them
    assert auto_sample_shape(LLAMA_8B, 138496, 8, 4) == {"data": 2, "fsdp": 1, "tensor": 4}
    # Qwen2-0.5B-like: 14 heads / 2 KV heads -> only 2 divides them
    odd = dataclasses.replace(LLAMA_8B, num_heads=14, num_kv_heads=2, intermediate_size=4864)
    assert auto_sample_shape(odd, 151936, 8, 8) == {"data": 4, "fsdp": 1, "tensor": 2}
    # nothing above 1 divides: replicated weights, data parallel decoding
    prime = dataclasses.replace(LLAMA_8B, num_heads=7, num_kv_heads=7)
    assert auto_sample_shape(prime, 138496, 8, 8) == {"data": 8, "fsdp": 1, "tensor": 1}
    # a vocabulary that 8 does not divide caps the tensor axis
    assert auto_sample_shape(LLAMA_8B, 138500, 8, 8)["tensor"] == 4


def test_sample_mesh_specs():
    if jax.device_count() < 8:
        pytest.skip(f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), have {jax.device_count()}")
    train = make_mesh(1, 8, 1, devices=jax.devices()[:8])
    assert sample_mesh_for("", train) is train
    assert dict(sample_mesh_for("auto", train, TINY, 96).shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert dict(sample_mesh_for("data=2,fsdp=1,tensor=4", train).shape) == {"data": 2, "fsdp": 1, "tensor": 4}
    with pytest.raises(ValueError, match="needs 4 devices"):
        sample_mesh_for("data=2,fsdp=1,tensor=2", train)
    with pytest.raises(ValueError, match="model config"):
        sample_mesh_for("auto", train)


def test_copy_dtype_follows_the_compute_dtype():
    assert copy_dtype("auto", TINY) == jnp.bfloat16
    assert copy_dtype("auto", dataclasses.replace(TINY, dtype="float32")) == jnp.float32
    assert copy_dtype("keep", TINY) is None
    assert copy_dtype("float16", TINY) == jnp.float16
    from dlr_jax.config.base import ConfigError
    from dlr_jax.config.stages import RLConfig

    with pytest.raises(ConfigError, match="rl.sample_dtype"):
        RLConfig(sample_dtype="bf17")


def _prompts(n: int) -> list[list[int]]:
    rs = np.random.RandomState(0)
    return [rs.randint(1, TINY.vocab_size, int(k)).tolist() for k in rs.randint(3, 14, n)]


def _rows(prompts, out) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded [prompt ; generated] rows and their attention mask."""
    width = max(map(len, prompts)) + out.tokens.shape[1]
    ids, mask = np.zeros((len(prompts), width), np.int32), np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
        row = p + out.tokens[i, : out.lengths[i]].tolist()
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return ids, mask


def test_copy_decodes_and_scores_as_the_master_weights():
    """bf16 compute: the forward casts every weight to bf16 before use, so a bf16 copy on the decoding
    layout gives the fp32 master weights' greedy tokens and scores, holding a quarter of the bytes
    per device on a tensor = 2 mesh (half from bf16, half from the split)."""
    if jax.device_count() < 8:
        pytest.skip(f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), have {jax.device_count()}")
    train = make_mesh(1, 8, 1, devices=jax.devices()[:8])
    model = create_sharded(lambda: Transformer(TINY, rngs=nnx.Rngs(0)), train)
    graphdef, state = nnx.split(model)
    smesh = sample_mesh_for("auto", train, TINY, TINY.vocab_size)
    copy = SamplingCopy(state, smesh, "fsdp", copy_dtype("auto", TINY))
    copied = copy(state)

    params = jax.tree.leaves(nnx.state(nnx.merge(graphdef, copied), nnx.Param))
    assert all(x.dtype == jnp.bfloat16 for x in params)
    for x, sh in zip(jax.tree.leaves(copied), jax.tree.leaves(copy.shardings), strict=True):
        assert x.sharding.is_equivalent_to(sh, x.ndim)
    # the reference: the fp32 state replicated (what one device holds without any sharding)
    full_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    copy_bytes = copy.nbytes_per_device(nnx.state(nnx.merge(graphdef, copied), nnx.Param))
    assert copy_bytes <= 0.3 * full_bytes, (copy_bytes, full_bytes)

    prompts = _prompts(8)
    master = Sampler((graphdef, state), mesh=train, prompt_bucket=16, max_total_len=40)
    sampled = Sampler((graphdef, copied), mesh=smesh, prompt_bucket=16, max_total_len=40)
    a, b = master.generate(prompts, max_new_tokens=8), sampled.generate(prompts, max_new_tokens=8)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    ids, mask = _rows(prompts, a)
    np.testing.assert_allclose(sampled.score(ids, mask), master.score(ids, mask), atol=2e-2)
    # on the training layout the copy's scores are the master's, bit for bit: only the dtype moved
    same = Sampler((graphdef, SamplingCopy(state, train, "fsdp", jnp.bfloat16)(state)), mesh=train,
                   prompt_bucket=16, max_total_len=40)
    np.testing.assert_array_equal(same.score(ids, mask), master.score(ids, mask))

    # refreshed after an update: new values, the same layout, and the sampler reuses its programs
    compiled = sampled.compile_count
    bumped = jax.tree.map(lambda x: x * 1.5 if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    sampled.set_state(copy(bumped))
    c = sampled.generate(prompts, max_new_tokens=8)
    assert sampled.compile_count == compiled
    assert not np.array_equal(c.logprobs, b.logprobs)
