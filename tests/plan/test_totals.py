"""A stage's totals padded and packed side by side (dlr_jax/plan/totals.py), against examples worked out by hand:
the packer's rows, the steps of an epoch-based recipe, the FLOPs and the time at the roofline."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from dlr_jax.config import load_config
from dlr_jax.plan import lengths as L
from dlr_jax.plan import totals

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
# 300 synthetic examples (tiny.yaml holds none back for RL), rows of 256 tokens, 16 rows a step, 2 epochs
RECIPE = ["data.synthetic_train=300", "data.max_len=256", "train.sft.batch_size=16", "train.sft.num_epochs=2",
          "train.textsft.batch_size=8", "train.textsft.num_epochs=1", "train.align.batch_size=16",
          "train.align.num_epochs=2"]


def by_hand(stage: str, length: int, *overrides: str) -> dict:
    cfg = load_config(TINY, [*RECIPE, *overrides])
    lengths = L.Lengths(stage, (length,) * 300, 300, ("by hand",), "-", False)
    batch = getattr(cfg.train, stage).batch_size
    return totals.stage_total_flops(cfg, stage, 1e12, types.SimpleNamespace(steps_per_epoch_examples=batch), lengths)


@pytest.mark.parametrize(("length", "per_row", "packed_steps"), [
    (64, 4, 10),  # 4 x 64 fill a row exactly: 75 rows an epoch, 2 x 75 / 16 -> 10 steps
    (100, 2, 19),  # 2 x 100 = 200, a third does not fit: 150 rows, 2 x 150 / 16 -> 19 steps
    (200, 1, 38),  # one a row: packing changes nothing
])
def test_packed_totals_of_a_written_out_example(length, per_row, packed_steps):
    r = by_hand("sft", length)
    # padded: one example a row, 2 epochs of 300 at 16 rows a step = 38 steps (the last one partial) of 1e12 FLOPs
    assert r["stage_examples"] == 300 and r["stage_steps"] == 38 and r["stage_total_flops"] == 38e12
    assert r["examples_per_row"] == per_row
    assert r["stage_steps_packed"] == packed_steps and r["stage_total_flops_packed"] == packed_steps * 1e12
    assert r["padded_efficiency"] == pytest.approx(length / 256)
    assert r["packed_efficiency"] == pytest.approx(per_row * length / 256)
    assert r["length_mean"] == r["length_max"] == length and r["longer_than_max_len"] == 0


def test_textsft_reads_its_own_recipe_and_packs_like_the_others():
    # the CoT-SFT baseline: sft's examples, train.textsft's batch (8) and epochs (1): 300 / 8 -> 38 padded steps;
    # 4 a row: 75 rows / 8 -> 10 packed steps
    r = by_hand("textsft", 64)
    assert (r["stage_steps"], r["stage_steps_packed"]) == (38, 10)
    assert r["stage_total_flops"] == 38e12 and r["stage_total_flops_packed"] == 10e12
    assert "paper_total_flops" not in r  # the paper gives no figure for its baseline


def test_stage_times_are_steps_times_the_roofline_step():
    r = by_hand("align", 64) | {"roofline_step_s": 0.5}
    assert totals.stage_times(r) == {"stage_roofline_s": 38 * 0.5, "stage_roofline_s_packed": 10 * 0.5}
    # sft's dual branch: the packed step is its own program, timed by its own compile ...
    dual = r | {"flops_per_step_packed": 1.5e12, "roofline_step_s_packed": 0.8}
    assert totals.stage_times(dual) == {"stage_roofline_s": 19.0, "stage_roofline_s_packed": 10 * 0.8}
    # ... and without that compile its time is left out, not taken from the padded step
    assert totals.stage_times({k: v for k, v in dual.items() if k != "roofline_step_s_packed"}) == \
        {"stage_roofline_s": 19.0}
    # no roofline (the CPU fallback): no times at all
    assert totals.stage_times(by_hand("align", 64)) == {}


@pytest.mark.parametrize(("length", "rows", "rows_mode_steps"), [(64, 4, 10), (100, 8, 19), (200, 16, 38)])
def test_packed_steps_of_batch_size_examples_are_as_many_as_padded_on_fewer_rows(length, rows, rows_mode_steps):
    # data.pack_batch=examples: 16 examples a step in 16 / examples_per_row rows (4 a row of 64: 4 rows), so an epoch is
    # the padded recipe's 38 steps, each a rows / 16 share of the padded step's FLOPs and roofline time
    r = by_hand("sft", length, "data.pack=true", "data.pack_batch=examples")
    assert r["pack_batch"] == "examples" and r["packed_rows_per_step"] == rows
    assert r["stage_steps"] == r["stage_steps_packed"] == 38
    assert r["stage_total_flops_packed"] == pytest.approx(38e12 * rows / 16)
    # the compute term shrinks with the rows, the memory term (weights, optimizer state) is kept
    compute_bound = r | {"roofline_step_s": 0.5, "roofline_compute_s": 0.5, "roofline_memory_s": 0.05}
    assert totals.stage_times(compute_bound)["stage_roofline_s_packed"] == pytest.approx(
        38 * max(0.5 * rows / 16, 0.05))
    memory_bound = r | {"roofline_step_s": 0.5, "roofline_compute_s": 0.2, "roofline_memory_s": 0.5}
    assert totals.stage_times(memory_bound)["stage_roofline_s_packed"] == pytest.approx(38 * 0.5)
    if rows < 16:  # fewer rows and no terms to scale: not guessed
        assert "stage_roofline_s_packed" not in totals.stage_times(r | {"roofline_step_s": 0.5})
    rows_mode = by_hand("sft", length, "data.pack=true")  # batch_size rows a step: fewer, fuller steps
    assert rows_mode["packed_rows_per_step"] == 16 and rows_mode["stage_steps_packed"] == rows_mode_steps


@pytest.mark.parametrize(("length", "rows"), [(64, 4), (100, 8), (200, 16)])
def test_exact_packed_steps_are_the_padded_steps_on_the_rows_a_batch_needs(length, rows):
    # data.pack_batch=exact: every step holds the padded step's 16 examples, packed first-fit-decreasing into the rows
    # its micro-batch needs (4 of 64 tokens a row of 256: 4 rows; 2 of 100: 8; 1 of 200: 16): the padded 38 steps
    r = by_hand("sft", length, "data.pack=true", "data.pack_batch=exact")
    assert r["pack_batch"] == "exact" and r["packed_rows_per_step"] == rows
    assert r["stage_steps"] == r["stage_steps_packed"] == 38
    assert r["stage_total_flops_packed"] == pytest.approx(38e12 * rows / 16)
    # two micro-batches of 8 packed apart, each in half the rows: the same step
    accum = by_hand("sft", length, "data.pack=true", "data.pack_batch=exact", "train.sft.grad_accum=2")
    assert accum["packed_rows_per_step"] == rows and accum["stage_steps_packed"] == 38
