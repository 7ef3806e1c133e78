import jax
import jax.numpy as jnp

from dlr_jax.plan.buffers import largest_values


def test_the_logits_are_the_largest_value_and_flagged_vocab_sized():
    def f(h, w):
        logits = h @ w  # [64, 1000] f32: the vocabulary-sized value
        return jnp.sum(jax.nn.log_softmax(logits) * 2.0), logits

    text = jax.jit(f).lower(jax.ShapeDtypeStruct((64, 32), jnp.float32),
                            jax.ShapeDtypeStruct((32, 1000), jnp.float32)).compile().as_text()
    rows = largest_values(text, vocab=1000)
    assert rows[0]["shape"] == [64, 1000] and rows[0]["bytes"] == 64 * 1000 * 4 and rows[0]["vocab_sized"]
    assert all(r["hlo_op"] != "parameter" for r in rows)


def test_only_a_vocabulary_size_flags_a_value():
    """A dimension equal to one of the given vocabulary sizes (whole or a tensor shard), not any dimension at least
    that large: token counts and MLP widths of a small-vocabulary model are not vocabulary-sized."""
    def f(h, w, u):
        return jnp.tanh(h @ w), jnp.tanh(h @ u)  # [64, 500]: a shard of 1000 rows; [64, 4096]: an MLP width

    text = jax.jit(f).lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in ((64, 32), (32, 500), (32, 4096)))
                            ).compile().as_text()
    flagged = {tuple(r["shape"]): r["vocab_sized"] for r in largest_values(text, vocab={1000, 500})}
    assert flagged[(64, 500)] and not flagged[(64, 4096)]
    assert not any(r["vocab_sized"] for r in largest_values(text, vocab=1000))
