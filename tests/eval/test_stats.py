"""Batching and statistics of an evaluation (dlr_jax/eval/stats.py)."""

from __future__ import annotations

import pytest

from dlr_jax.eval import stats as eval_stats


def test_mean_std_and_batches():
    m = eval_stats.mean_std([0.5, 0.7])
    assert m["per_seed"] == [0.5, 0.7] and m["mean"] == pytest.approx(0.6) and m["std"] == pytest.approx(0.1)
    batches = eval_stats.length_sorted_batches([5, 1, 3, 2, 4], 2)
    assert [b.tolist() for b in batches] == [[1, 3], [2, 4], [0, 0]]
