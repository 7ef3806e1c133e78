"""`lookup_rows`: the looked-up rows and their gradient equal a plain `table[ids]` on every layout,
and no device ever holds the whole table (nor a whole column block of it) to look rows up."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from dlr_jax import sharding as sh
from dlr_jax.config import ModelConfig
from dlr_jax.models.embedding import lookup_rows, vocab_split
from dlr_jax.models.transformer import Transformer

V, D = 1024, 64
B, T = 4, 6
# (data, fsdp, tensor), rules: the training layouts and the sampling copy's tensor-parallel one.
LAYOUTS = [((1, 8, 1), "fsdp"), ((1, 2, 4), "fsdp"), ((2, 1, 4), "tp"), ((8, 1, 1), "tp"), ((1, 1, 8), "tp")]

needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 fake devices: make test sets "
                             "XLA_FLAGS=--xla_force_host_platform_device_count=8")


def _inputs(mesh, rules):
    rs = np.random.RandomState(0)
    table = rs.randn(V, D).astype(np.float32)
    ids = rs.randint(0, V, (B, T)).astype(np.int32)
    ids[0, :4] = [0, V - 1, V // 4 - 1, V // 4]  # the first and last rows, and both sides of a shard edge
    table_s = jax.device_put(table, sh.named_sharding(mesh, ("vocab", "embed"), table.shape, rules))
    ids_s = jax.device_put(ids, sh.named_sharding(mesh, ("batch", "length"), ids.shape, rules))
    return table, ids, table_s, ids_s


def _jit(fn, mesh, rules):
    def run(*args):
        with sh.use_mesh(mesh), sh.activation_rules(rules):
            return jax.jit(fn)(*args)

    def lower(*args):
        with sh.use_mesh(mesh), sh.activation_rules(rules):
            return jax.jit(fn).lower(*args).compile()

    return run, lower


@needs_8
@pytest.mark.parametrize(("shape", "rules"), LAYOUTS)
def test_lookup_rows_and_their_gradient_equal_a_plain_lookup(shape, rules):
    mesh = sh.make_mesh(*shape)
    table, ids, table_s, ids_s = _inputs(mesh, rules)
    w = np.random.RandomState(1).randn(B, T, D).astype(np.float32)
    run, _ = _jit(lambda t, i: lookup_rows(t, i), mesh, rules)
    np.testing.assert_array_equal(run(table_s, ids_s), table[ids])  # bit for bit: the sum adds zeros
    grad, _ = _jit(jax.grad(lambda t, i: (lookup_rows(t, i) * w).sum()), mesh, rules)
    ref = np.zeros_like(table)
    np.add.at(ref, ids, w)  # d/d table of sum(table[ids] * w): each id's weight row scattered back
    np.testing.assert_allclose(grad(table_s, ids_s), ref, rtol=1e-6, atol=1e-6)


def _table_shaped(hlo: str, shapes: set[tuple[int, ...]]) -> list[str]:
    """Instructions (not parameters) that produce an f32 array of one of `shapes`."""
    return [f"{op} {dims}" for op, dims in re.findall(r"%([\w.-]+) = f32\[([\d,]+)\]", hlo)
            if not op.startswith("param") and tuple(int(x) for x in dims.split(",")) in shapes]


@needs_8
@pytest.mark.parametrize(("shape", "rules"), LAYOUTS)
def test_no_device_gathers_the_table_to_look_rows_up(shape, rules):
    """Per device: nothing in the program has the table's whole vocab dim (the whole table, or all of
    its rows for this device's columns), and the program's temporaries stay below one table shard."""
    mesh = sh.make_mesh(*shape)
    table, _, table_s, ids_s = _inputs(mesh, rules)
    _, lower = _jit(lambda t, i: lookup_rows(t, i), mesh, rules)
    compiled = lower(table_s, ids_s)
    shard = table_s.sharding.shard_shape(table.shape)
    whole = {(V, D), (V, shard[1]), (D, V), (shard[1], V)}
    assert not _table_shaped(compiled.as_text(), whole), _table_shaped(compiled.as_text(), whole)
    assert compiled.memory_analysis().temp_size_in_bytes < 4 * shard[0] * shard[1]

    # The control: the lookup as the model wrote it before (the table viewed as split on its embed dim
    # only, so no gather from a table split on both dims) all-gathers the vocab dim onto every device.
    if _vocab_split(mesh, rules) > 1:
        _, lower_old = _jit(lambda t, i: jnp.take(sh.constrain(t, (None, "embed")), i, axis=0), mesh, rules)
        old = lower_old(table_s, ids_s)
        assert _table_shaped(old.as_text(), whole)
        assert old.memory_analysis().temp_size_in_bytes >= 4 * V * shard[1]


def _vocab_split(mesh, rules) -> int:
    with sh.use_mesh(mesh), sh.activation_rules(rules):
        return vocab_split((V, D))


@needs_8
@pytest.mark.parametrize(("shape", "rules"), [((1, 8, 1), "fsdp"), ((2, 1, 4), "tp")])
def test_a_sharded_transformer_embeds_tokens_without_gathering_its_table(shape, rules):
    """The model's own `embed_tokens` on a training layout (FSDP: the embed dim split) and on the
    sampling copy's (vocab split over "tensor"): the rows equal its table's, and the compiled lookup
    holds no array with the table's whole vocab dim."""
    cfg = ModelConfig(vocab_size=V, hidden_size=D, intermediate_size=128, num_layers=1, num_heads=8,
                      num_kv_heads=4, head_dim=8)
    mesh = sh.make_mesh(*shape)
    graphdef, state = nnx.split(sh.create_sharded(lambda: Transformer(cfg, rngs=nnx.Rngs(0)), mesh, rules))
    shard = state["embed"][...].sharding.shard_shape((V, D))
    assert shard != (V, D)  # the table is split: on its embed dim (FSDP) or its vocab dim (TP)
    ids = jax.device_put(np.arange(8 * T, dtype=np.int32).reshape(8, T) * 41 % V,
                         NamedSharding(mesh, sh.logical_to_spec(("batch", "length"), (8, T), mesh, rules)))
    run, lower = _jit(lambda s, i: nnx.merge(graphdef, s).embed_tokens(i), mesh, rules)
    assert not _table_shaped(lower(state, ids).as_text(), {(V, D), (V, shard[1])})
    np.testing.assert_array_equal(run(state, ids), np.asarray(state["embed"][...])[np.asarray(ids)])
