"""FLOP counting on the jaxpr: loop bodies times their trip counts, against written-out counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.models.transformer import Transformer
from dlr_jax.plan.flops import count_fn, dense_lm_flops
from dlr_jax.stages.common import lm_loss


def test_scan_and_while_bodies_count_trip_times():
    x, w = jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((5, 8, 16), jnp.float32)

    def scanned(x, w):
        return jax.lax.scan(lambda c, wi: (c, c @ wi), x, w)[1]

    assert count_fn(scanned, x, w).matmul == 5 * 2 * 4 * 8 * 16

    def looped(x):  # a while loop (fori_loop with static bounds would become a scan)
        return jax.lax.while_loop(lambda c: c[0] < 7, lambda c: (c[0] + 1, c[1] @ jnp.ones((8, 8))), (0, x))[1]

    once = count_fn(looped, x)
    assert once.matmul == 2 * 4 * 8 * 8 and once.unknown_loops == 1
    seven = count_fn(looped, x, while_trips=lambda eqn: 7)
    assert seven.matmul == 7 * 2 * 4 * 8 * 8 and seven.unknown_loops == 0


def test_conv_flops_match_a_hand_count():
    img, k = jax.ShapeDtypeStruct((2, 3, 16, 16), jnp.float32), jax.ShapeDtypeStruct((8, 3, 3, 3), jnp.float32)
    conv = lambda a, b: jax.lax.conv_general_dilated(a, b, (2, 2), "SAME")  # noqa: E731
    assert count_fn(conv, img, k).matmul == 2 * (2 * 8 * 8 * 8) * (3 * 3 * 3)


def test_grouped_expert_matmuls_count_each_row_against_its_own_group_forward_and_backward():
    # MoE experts (models/moe.py): 12 tokens in 3 groups, d 8 -> 5; each token meets one expert's [8, 5]
    m, g, k, n = 12, 3, 8, 5
    x, w = jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((g, k, n), jnp.float32)
    sizes = jnp.array([5, 4, 3], jnp.int32)
    experts = lambda a, b: jax.lax.ragged_dot(a, b, sizes)  # noqa: E731
    assert count_fn(experts, x, w).matmul == 2 * m * k * n
    # backward: d/dx (ragged on rows, as forward) and d/dw (ragged on the contracted rows, output [g, k, n])
    # each cost the forward's matmul again, not g times it
    step = count_fn(jax.grad(lambda a, b: jnp.sum(experts(a, b) ** 2), argnums=(0, 1)), x, w)
    assert step.matmul == 3 * 2 * m * k * n
    # with a batch dim (group sizes [B, g]): B times the unbatched count, forward and backward
    b = 4
    dn = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((2,), (2,)), ((0,), (0,))),
                                           lhs_ragged_dimensions=(1,), rhs_group_dimensions=(1,))
    bsizes = jnp.tile(sizes, (b, 1))
    batched = lambda a, c: jax.lax.ragged_dot_general(a, c, bsizes, dn)  # noqa: E731
    bx, bw = jax.ShapeDtypeStruct((b, m, k), jnp.float32), jax.ShapeDtypeStruct((b, g, k, n), jnp.float32)
    assert count_fn(batched, bx, bw).matmul == b * 2 * m * k * n
    bstep = count_fn(jax.grad(lambda a, c: jnp.sum(batched(a, c) ** 2), argnums=(0, 1)), bx, bw)
    assert bstep.matmul == b * 3 * 2 * m * k * n


@pytest.mark.parametrize("remat", ["none", "full"])
def test_train_step_of_a_dense_lm_matches_6N_plus_attention(remat):
    cfg = ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                      num_kv_heads=2, head_dim=32, remat=remat)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    b, t = 4, 64
    batch = {k: jax.ShapeDtypeStruct((b, t), jnp.int32) for k in ("tokens", "loss_mask", "segment_ids", "positions")}

    def loss(state, batch):
        total, weight, _ = lm_loss(nnx.merge(graphdef, state), batch, None)
        return total / weight

    counted = count_fn(jax.grad(loss), state, batch)
    # remat=full: the layers' forward runs again in the backward pass (8N instead of 6N for them)
    analytic = dense_lm_flops(cfg, b * t, t, recompute=remat == "full")
    assert counted.unknown_loops == 0
    assert counted.matmul == pytest.approx(analytic, rel=0.10)
    np.testing.assert_array_less(0, counted.pointwise)


def test_a_pallas_kernel_counts_its_body_once_per_grid_point():
    """The TPU splash kernel (models/splash.py) is a pallas_call: its matmuls sit in a body the grid
    repeats; counted that way it does the XLA attention's QK^T and PV FLOPs."""
    from dlr_jax.models.transformer import attention, causal_mask

    q, kv, seg = jnp.ones((2, 256, 4, 16)), jnp.ones((2, 256, 2, 16)), jnp.ones((2, 256), jnp.int32)
    splash = count_fn(lambda q, k, v: attention(q, k, v, causal_mask(seg), "splash", seg), q, kv, kv)
    xla = count_fn(lambda q, k, v: attention(q, k, v, causal_mask(seg), "xla"), q, kv, kv)
    assert splash.matmul == xla.matmul == 2 * 2 * (2 * 256 * 256 * 4 * 16)
