"""The paper's loss reduction (per-example sums averaged over the batch) in the one training loop: examples are
counted in packed rows, gradient accumulation gives the big batch's step, and the logs stay per token."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ModelConfig
from dlr_jax.models.transformer import Transformer
from dlr_jax.stages.common import lm_loss
from dlr_jax.training.optimizer import make_optimizer
from dlr_jax.training.reduction import count_examples, vq_weights
from dlr_jax.training.trainer import TrainConfig, build_step_fn

CFG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                  head_dim=8)
# SGD keeps the update linear in the gradient; no warm-up, so the first step moves the parameters
TCFG = TrainConfig(learning_rate=0.5, optimizer="sgd", batch_size=8, num_steps=2, warmup_ratio=0.0)
T = 12


def test_count_examples_counts_segments_with_a_target():
    seg = np.array([[1, 1, 2, 2, 2, 3, 3, 0],  # 1: no target; 2 and 3: targets
                    [2, 2, 2, 1, 1, 1, 1, 1],  # ids need not increase along the row
                    [0] * 8,  # padding
                    [1] * 8])  # one example, two separate target spans
    mask = np.array([[0, 0, 0, 1, 1, 0, 1, 0],
                     [0, 1, 0, 0, 1, 1, 0, 0],
                     [0] * 8,
                     [0, 1, 0, 0, 0, 1, 1, 0]], bool)
    assert float(count_examples(jnp.asarray(mask), jnp.asarray(seg))) == 2 + 2 + 0 + 1


def test_vq_weights():
    h = jnp.zeros((3, 4, 5))
    assert [float(x) for x in vq_weights(h, jnp.float32(17), "sum")] == [3, 60]
    assert [float(x) for x in vq_weights(h, jnp.float32(17), "mean")] == [17, 17]
    with pytest.raises(ValueError, match="mean|sum"):
        vq_weights(h, jnp.float32(17), "none")


def _rows(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    """Packed rows of 1-3 examples, each with a prompt (no loss) and a target span; uneven counts per row."""
    rs = np.random.RandomState(seed)
    out = []
    for i in range(n):
        seg, lm, pos = np.zeros(T, np.int32), np.zeros(T, np.int32), np.zeros(T, np.int32)
        start = 0
        for s in range(1, 1 + (i % 3) + 1):
            length = int(rs.randint(2, 5))
            if start + length > T:
                break
            seg[start:start + length] = s
            lm[start + 1:start + length] = 1
            pos[start:start + length] = np.arange(length)
            start += length
        out.append({"tokens": rs.randint(0, CFG.vocab_size, T).astype(np.int32), "loss_mask": lm,
                    "segment_ids": seg, "positions": pos})
    return out


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
    rows = _rows(seed, 8)
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def _examples(batch: dict[str, np.ndarray]) -> int:
    return int(count_examples(jnp.asarray(batch["loss_mask"][:, 1:] > 0), jnp.asarray(batch["segment_ids"][:, 1:])))


def _step(reduction: str, grad_accum: int, batch: dict[str, np.ndarray]):
    """The trainer's step (`build_step_fn`), once, from the same initial model: (params after it, metrics)."""
    graphdef, params, rest = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tx, schedule = make_optimizer(dataclasses.replace(TCFG, grad_accum=grad_accum))
    step = jax.jit(build_step_fn(graphdef, functools.partial(lm_loss, reduction=reduction), tx, schedule))
    micro = {k: jnp.asarray(v.reshape(grad_accum, -1, *v.shape[1:])) for k, v in batch.items()}
    params, _, metrics = step(params, rest, tx.init(params), micro, jax.random.key(0), jnp.int32(0))
    return params, {k: float(v) for k, v in metrics.items()}


def test_gradient_accumulation_with_sum_reduction_equals_one_big_batch():
    batch = _batch()
    # The micro-batches hold different numbers of examples, so averaging their per-example means would differ.
    micro = [_examples({k: v[i:i + 2] for k, v in batch.items()}) for i in range(0, 8, 2)]
    assert len(set(micro)) > 1
    p0 = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)), nnx.Param, ...)[1]
    one, m_one = _step("sum", 1, batch)
    acc, m_acc = _step("sum", 4, batch)
    moved = 0.0
    for x, y, z in zip(jax.tree.leaves(one), jax.tree.leaves(acc), jax.tree.leaves(p0), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
        moved = max(moved, float(np.abs(np.asarray(x) - np.asarray(z)).max()))
    assert moved > 1e-3  # the step did update the parameters
    assert m_one["weight"] == m_acc["weight"] == sum(micro)
    np.testing.assert_allclose(m_one["loss"], m_acc["loss"], rtol=1e-6)


def test_sum_reduction_logs_per_token_means():
    """The step's metrics come before its update: the two reductions see the same model and batch."""
    batch = _batch()
    _, summed = _step("sum", 1, batch)
    _, mean = _step("mean", 1, batch)
    examples = _examples(batch)
    assert summed["tokens"] == mean["tokens"] == mean["weight"] and summed["weight"] == examples < summed["tokens"]
    np.testing.assert_allclose(summed["ce"], mean["loss"], rtol=1e-6)  # per token, whatever is optimised
    np.testing.assert_allclose(summed["token_accuracy"], mean["token_accuracy"], rtol=1e-6)
    np.testing.assert_allclose(summed["loss"], mean["loss"] * summed["tokens"] / examples, rtol=1e-5)
