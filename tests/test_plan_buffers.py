import jax
import jax.numpy as jnp

from dlr_jax.plan_buffers import largest_values


def test_the_logits_are_the_largest_value_and_flagged_vocab_sized():
    def f(h, w):
        logits = h @ w  # [64, 1000] f32: the vocabulary-sized value
        return jnp.sum(jax.nn.log_softmax(logits) * 2.0), logits

    text = jax.jit(f).lower(jax.ShapeDtypeStruct((64, 32), jnp.float32),
                            jax.ShapeDtypeStruct((32, 1000), jnp.float32)).compile().as_text()
    rows = largest_values(text, vocab=1000)
    assert rows[0]["shape"] == [64, 1000] and rows[0]["bytes"] == 64 * 1000 * 4 and rows[0]["vocab_sized"]
    assert all(r["hlo_op"] != "parameter" for r in rows)
