"""Format reward, reward registry (answer scoring: tests/text/test_answers.py)."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.data.paths import shared_data_dir
from dlr_jax.rewards import answer_format as rewards_mod
from dlr_jax.rewards.answer_format import (
    BoundaryIds,
    RewardInputs,
    combine_rewards,
    format_reward,
    format_reward_batch,
    get_reward,
    latent_ids_per_row,
    list_rewards,
    register_reward,
)


def _data_dir() -> Path:
    return shared_data_dir()  # honours $DLR_DATA_DIR, else ../shared/data


# --------------------------------------------------------------------------------------------- format

# Toy vocabulary: text ids < 10, boundary ids 10..13, latent ids 100..163.
LS, LE, AS, AE, PAD = 10, 11, 12, 13, 0
OFFSET, NUM = 100, 64
IDS = dict(latent_start_id=LS, latent_end_id=LE, answer_start_id=AS, answer_end_id=AE)

FORMAT_CASES = [
    ("well formed", [LS, 100, 105, 163, LE, AS, 4, 2, AE], 1.0),
    ("text before / between / after", [7, LS, 101, LE, 3, AS, 4, AE, 9], 1.0),
    ("empty latent span", [LS, LE, AS, 4, AE], 1.0),
    ("missing </latent>", [LS, 100, 101, AS, 4, AE], 0.0),
    ("missing </answer>", [LS, 100, LE, AS, 4], 0.0),
    ("missing <answer>", [LS, 100, LE, 4, AE], 0.0),
    ("two latent spans", [LS, 100, LE, LS, 101, LE, AS, 4, AE], 0.0),
    ("two answer spans", [LS, 100, LE, AS, 4, AE, AS, 5, AE], 0.0),
    ("answer before latent", [AS, 4, AE, LS, 100, LE], 0.0),
    ("latent end before start", [LE, 100, LS, AS, 4, AE], 0.0),
    ("text token inside latent span", [LS, 100, 5, 101, LE, AS, 4, AE], 0.0),
    ("latent id in the answer", [LS, 100, LE, AS, 120, AE], 0.0),
    ("latent id before the span", [100, LS, 101, LE, AS, 4, AE], 0.0),
    ("latent id just past the range is text", [LS, 100, LE, AS, OFFSET + NUM, AE], 1.0),
]


@pytest.mark.parametrize("name, seq, want", FORMAT_CASES, ids=[c[0] for c in FORMAT_CASES])
def test_format_reward_cases(name, seq, want):
    assert format_reward(seq, **IDS, is_latent=(OFFSET, NUM)) == want
    # A scalar predicate gives the same verdict.
    assert format_reward(seq, **IDS, is_latent=lambda i: OFFSET <= i < OFFSET + NUM) == want


def test_format_reward_batch_numpy_and_jax():
    t = max(len(s) for _, s, _ in FORMAT_CASES) + 3
    ids = np.full((len(FORMAT_CASES), t), PAD, np.int64)
    mask = np.zeros_like(ids, bool)
    for i, (_, seq, _) in enumerate(FORMAT_CASES):
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = True
    want = np.array([w for _, _, w in FORMAT_CASES], np.float32)
    got = format_reward_batch(ids, mask, **IDS, is_latent=(OFFSET, NUM))
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    # Boundary/latent ids hidden under the padding mask do not count.
    ids2 = ids.copy()
    ids2[0, -1] = 150
    np.testing.assert_array_equal(format_reward_batch(ids2, mask, **IDS, is_latent=(OFFSET, NUM)), want)
    assert format_reward_batch(ids2, None, **IDS, is_latent=(OFFSET, NUM))[0] == 0.0
    # JAX, jitted.
    fn = jax.jit(lambda x, m: format_reward_batch(x, m, **IDS, is_latent=(OFFSET, NUM)))
    np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(ids), jnp.asarray(mask))), want)
    # min_latents and a latent span opened by the prompt.
    one = np.array([[LS, LE, AS, 4, AE]])
    assert format_reward_batch(one, None, **IDS, is_latent=(OFFSET, NUM), min_latents=1)[0] == 0.0
    cont = np.array([[100, 101, LE, AS, 4, AE], [LS, 101, LE, AS, 4, AE]])
    got = format_reward_batch(cont, None, **IDS, is_latent=(OFFSET, NUM), latent_start_in_prompt=True)
    np.testing.assert_array_equal(got, [1.0, 0.0])
    with pytest.raises(ValueError, match="mask shape"):
        format_reward_batch(ids, mask[:, :2], **IDS, is_latent=(OFFSET, NUM))


def test_latent_ids_per_row():
    bd = BoundaryIds(LS, LE, AS, AE, OFFSET, NUM)
    ids = np.array(
        [[3, LS, 100, 163, LE, AS, 4, AE], [LS, 101, 102, 103, 104, 0, 0, 0], [4, 4, AE, 0, 0, 0, 0, 0]]
    )
    mask = np.array([[1] * 8, [1] * 5 + [0] * 3, [1] * 3 + [0] * 5])
    got = latent_ids_per_row(ids, mask, bd)
    assert [g.tolist() for g in got] == [[0, 63], [1, 2, 3, 4], []]


# ------------------------------------------------------------------------------------------- registry


def test_registry_and_combine():
    assert {"answer", "format"} <= set(list_rewards())
    bd = BoundaryIds(LS, LE, AS, AE, OFFSET, NUM)
    ids = np.array([[LS, 100, LE, AS, 4, AE], [LS, 5, LE, AS, 4, AE]])
    inputs = RewardInputs(
        completions=["<answer>4</answer>", "<answer>5</answer>"],
        golds=["4", "4"],
        benchmark="synthetic",
        completion_ids=ids,
        completion_mask=np.ones_like(ids),
        boundary=bd,
    )
    total, parts = combine_rewards(inputs, {"answer": 1.0, "format": 0.1})
    np.testing.assert_allclose(total, [1.1, 0.0], rtol=1e-6)
    assert parts["answer"].tolist() == [1.0, 0.0] and parts["format"].tolist() == [1.0, 0.0]

    @register_reward("test_length")
    def length_reward(inp: RewardInputs) -> np.ndarray:
        return np.asarray([len(c) for c in inp.completions], np.float32)

    try:
        _custom_reward_checks(inputs, length_reward)
    finally:
        rewards_mod._REWARDS.pop("test_length", None)


def _custom_reward_checks(inputs, length_reward):
    assert get_reward("test_length") is length_reward
    total, _ = combine_rewards(inputs, {"test_length": 0.5})
    np.testing.assert_allclose(total, [9.0, 9.0])
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_length")(lambda inp: np.zeros(2))
    register_reward("test_length", overwrite=True)(lambda inp: np.zeros(3))
    with pytest.raises(ValueError, match=r"returned shape \(3,\), expected \(2,\)"):
        combine_rewards(inputs, {"test_length": 1.0})
    with pytest.raises(ValueError, match="unknown reward 'nope'; registered: .*answer"):
        get_reward("nope")
    with pytest.raises(ValueError, match="needs RewardInputs.completion_ids"):
        get_reward("format")(RewardInputs(["a"], ["1"], "gsm8k"))
