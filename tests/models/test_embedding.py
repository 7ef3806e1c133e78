"""`lookup_rows`: the looked-up rows and their gradient equal a plain `table[ids]` on every layout,
and no device holds the whole table (nor a whole column block of it) to look a few rows up; a batch
with more ids than half the vocabulary gathers the vocab dim instead (less traffic there)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from dlr_jax.config import ModelConfig
from dlr_jax.core import sharding as sh
from dlr_jax.models.embedding import lookup_rows, vocab_parallel
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
    ids[0, :4] = [0, V - 1, V // 4 - 1, V // 4]  # the first and last rows, both sides of a shard edge
    ids[1, :2] = [V // 8 - 1, V // 8]  # (4 and 8 shards)
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

    # The control: a lookup from the table viewed as split on its embed dim only (the model's former
    # layout) all-gathers the vocab dim onto every device.
    if _vocab_parallel(mesh, rules, (B, T)) > 1:
        _, lower_old = _jit(lambda t, i: jnp.take(sh.constrain(t, (None, "embed")), i, axis=0), mesh, rules)
        old = lower_old(table_s, ids_s)
        assert _table_shaped(old.as_text(), whole)
        assert old.memory_analysis().temp_size_in_bytes >= 4 * V * shard[1]


def _vocab_parallel(mesh, rules, ids_shape) -> int:
    with sh.use_mesh(mesh), sh.activation_rules(rules):
        return vocab_parallel((V, D), ids_shape)


@needs_8
def test_ids_outside_the_vocabulary_give_zero_rows_on_either_path():
    for shape, rules in (((1, 1, 1), "tp"), ((2, 1, 4), "tp")):
        mesh = sh.make_mesh(*shape, devices=jax.devices()[: np.prod(shape)])
        table, ids, table_s, _ = _inputs(mesh, rules)
        ids[2, :3] = [-1, V, -V]
        run, _ = _jit(lambda t, i: lookup_rows(t, i), mesh, rules)
        out = np.asarray(run(table_s, jnp.asarray(ids)))
        np.testing.assert_array_equal(out[2, :3], 0.0)
        np.testing.assert_array_equal(out[2, 3:], table[ids[2, 3:]])


@needs_8
def test_rows_are_cast_before_the_shards_are_summed():
    """An fp32 table read in bf16 (the compute dtype): the rows equal the cast lookup, and the program
    sums the vocabulary shards' rows in bf16 (the all-reduce then moves half the bytes on GPUs and TPUs;
    XLA:CPU widens its own collectives to fp32 when it compiles, so the emitted program is checked)."""
    mesh = sh.make_mesh(2, 1, 4)
    table, ids, table_s, ids_s = _inputs(mesh, "tp")
    fn = lambda t, i: lookup_rows(t, i, jnp.bfloat16)  # noqa: E731
    run, _ = _jit(fn, mesh, "tp")
    out = run(table_s, ids_s)
    assert out.dtype == jnp.bfloat16
    ref = jnp.asarray(table[ids], jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
    with sh.use_mesh(mesh), sh.activation_rules("tp"):
        emitted = jax.jit(fn).lower(table_s, ids_s).as_text()
    sums = re.findall(r"stablehlo\.reduce.*applies stablehlo\.add across dimensions = \[0\] : \(tensor<4x(\w+)>",
                      emitted)
    assert sums == [f"{B}x{T}x{D}xbf16"], sums


@needs_8
def test_a_batch_with_more_ids_than_half_the_vocabulary_gathers_the_vocab_dim():
    """FSDP and TP together ("fsdp" rules, embed split): every device looks up every id of the global
    batch, so past V / 2 ids the all-reduce of the rows would move more than gathering the vocab dim;
    the lookup gathers then, and the rows are the same."""
    mesh = sh.make_mesh(1, 2, 4)
    assert _vocab_parallel(mesh, "fsdp", (B, T)) == 4
    big = (16, V // 32 + 1)  # 16 x 33 = 528 ids > 512
    assert _vocab_parallel(mesh, "fsdp", big) == 1
    table = np.random.RandomState(2).randn(V, D).astype(np.float32)
    ids = np.random.RandomState(3).randint(0, V, big).astype(np.int32)
    table_s = jax.device_put(table, sh.named_sharding(mesh, ("vocab", "embed"), table.shape, "fsdp"))
    run, lower = _jit(lambda t, i: lookup_rows(t, i), mesh, "fsdp")
    np.testing.assert_array_equal(run(table_s, jnp.asarray(ids)), table[ids])
    assert _table_shaped(lower(table_s, jnp.asarray(ids)).as_text(), {(V, D // 2)})  # the gathered vocab dim


@needs_8
@pytest.mark.parametrize(("shape", "rules"), [((1, 8, 1), "fsdp"), ((1, 2, 4), "fsdp"), ((2, 1, 4), "tp")])
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
