"""`data.pack_batch=exact` (`data.exact_rows`): every packed step holds exactly the padded step's examples, micro-batch
by micro-batch, in a fixed number of rows the run never outgrows; its data position counts global batches."""

import itertools
import json
from collections import Counter

import numpy as np
import pytest

from dlr_jax.data.exact_rows import ffd_bins, rows_needed, stream_lengths
from dlr_jax.data.items import fitting_items
from dlr_jax.data.pipeline import make_stage_dataset

K, MAX_LEN, B = 64, 320, 8  # fixtures examples, tok, table: conftest.py


def _ds(stage, examples, tok, table, **kw):
    kw = {"batch_size": B, "max_len": MAX_LEN, "seed": 3, "shard_index": 0, "shard_count": 1, "num_threads": 0,
          "latents": table, **kw}
    return make_stage_dataset(stage, examples, tok, **kw)


def _exact(stage, examples, tok, table, **kw):
    return _ds(stage, examples, tok, table, pack=True, pack_batch="exact", **kw)


def _segments(batch, rows):
    """Counter of (tokens, loss_mask) of every segment in rows `rows` of a batch (a padded row is one segment)."""
    out = Counter()
    for r in rows:
        seg = batch["segment_ids"][r]
        for s in range(1, int(seg.max()) + 1):
            m = seg == s
            np.testing.assert_array_equal(batch["positions"][r][m], np.arange(m.sum()))
            out[(tuple(batch["tokens"][r][m].tolist()), tuple(batch["loss_mask"][r][m].tolist()))] += 1
    return out


def test_first_fit_decreasing_by_hand():
    # longest first: 7 opens row 0, 5 row 1, 4 joins 5, 3 joins 7, 2 fits neither (room 0 and 1): row 2
    assert ffd_bins([5, 3, 7, 2, 4], 10) == [[2, 1], [0, 4], [3]]
    assert ffd_bins([4, 4, 4], 4) == [[0], [1], [2]]
    assert ffd_bins([], 8) == []
    with pytest.raises(ValueError, match="cannot be packed into rows of 8"):
        ffd_bins([9], 8)
    # the most any group of 3 needs: [6, 6, 6] -> 3 rows, [1, 1, 1] -> 1 row of 3 segments
    assert rows_needed(np.array([1, 1, 1, 6, 6, 6, 2]), 3, 10) == (3, 3)


@pytest.mark.parametrize("stage", ["textsft", "align", "sft"])
@pytest.mark.parametrize("accum", [1, 2])
def test_exact_steps_hold_the_padded_steps_examples_micro_batch_by_micro_batch(stage, accum, tok, examples, table):
    steps = 40  # several epochs of the ~140 examples at 8 a step: reshuffled epochs included
    padded = _ds(stage, examples, tok, table)
    exact = _exact(stage, examples, tok, table, grad_accum=accum, horizon_steps=steps)
    r = exact.global_batch // accum
    assert exact.packed and exact.pack_batch == "exact" and exact.examples_per_step == B
    assert r < B // accum  # fewer rows than examples
    for j, (a, b) in enumerate(itertools.islice(zip(padded, exact, strict=True), steps)):
        assert b["tokens"].shape == (accum * r, MAX_LEN), j  # one shape every step: no recompiles
        for m in range(accum):  # micro-batch m: the padded rows [m B/accum, ...) in packed rows [m r, ...)
            want = _segments(a, range(m * B // accum, (m + 1) * B // accum))
            assert _segments(b, range(m * r, (m + 1) * r)) == want, (j, m)
    # the rows are what the packer needs at most over those steps, replayed on the stream's lengths
    _, lengths, _ = fitting_items(stage, examples, tok, max_len=MAX_LEN, latents=table)
    stream = stream_lengths(lengths, 3, None, steps * B)
    assert r == rows_needed(stream, B // accum, MAX_LEN)[0]


def test_rows_come_in_the_multiple_the_mesh_needs_and_empty_rows_are_padding(tok, examples, table):
    free = _exact("sft", examples, tok, table, horizon_steps=10)
    on_mesh = _exact("sft", examples, tok, table, horizon_steps=10, grad_accum=2, row_multiple=2 * 3)
    r = on_mesh.global_batch // 2
    assert r % 3 == 0 and r >= free.global_batch // 2
    batch = next(iter(on_mesh))
    empty = batch["segment_ids"].max(axis=1) == 0
    assert empty.any()  # rows past what a micro-batch fills
    assert (batch["tokens"][empty] == tok.pad_id).all() and (batch["loss_mask"][empty] == 0).all()


def test_the_dual_branch_slots_pair_with_their_segments(tok, examples, table):
    padded = _ds("sft", examples, tok, table, ocr_text_len=48)
    exact = _exact("sft", examples, tok, table, ocr_text_len=48, horizon_steps=6)
    for a, b in itertools.islice(zip(padded, exact, strict=True), 6):
        rows, slots = b["ocr_segment_ids"].shape
        assert b["ocr_targets"].shape == (rows, slots, 48)
        want = {tuple(a["tokens"][i][a["segment_ids"][i] > 0].tolist()): (a["ocr_targets"][i], a["ocr_codes"][i])
                for i in range(B)}
        seen = 0
        for i in range(rows):
            seg = b["segment_ids"][i]
            for s in range(1, int(seg.max()) + 1):
                assert b["ocr_segment_ids"][i, s - 1] == s
                targets, codes = want[tuple(b["tokens"][i][seg == s].tolist())]
                np.testing.assert_array_equal(b["ocr_targets"][i, s - 1], targets)
                np.testing.assert_array_equal(b["ocr_codes"][i, s - 1], codes)
                seen += 1
            assert (b["ocr_segment_ids"][i, int(seg.max()):] == 0).all()
        assert seen == B


def test_a_curriculum_plans_rows_on_each_examples_longest_variant(tok, examples):
    from dlr_jax.data.curriculum import Curriculum
    from dlr_jax.data.latents import LatentTable, step_result_latents

    codes = step_result_latents(examples, K)  # one code per calculator step: k of them latent, the rest text
    table = LatentTable(dict(codes.items()), num_codes=K, steps={k: (1,) * len(v) for k, v in codes.items()})
    cur = Curriculum("stagewise", 0.25)
    padded = _ds("sft", examples, tok, table, curriculum=cur).schedule_curriculum(30)
    exact = _exact("sft", examples, tok, table, curriculum=cur, horizon_steps=30).schedule_curriculum(30)
    for a, b in itertools.islice(zip(padded, exact, strict=True), 30):
        assert _segments(b, range(b["tokens"].shape[0])) == _segments(a, range(B))


def test_resumes_by_global_batches_and_refuses_other_rows(tok, examples, table):
    from dlr_jax.config import ConfigError

    def make(**kw):
        return _exact("align", examples, tok, table, horizon_steps=40, **kw)

    it = iter(make())
    _ = [next(it) for _ in range(23)]  # past an epoch boundary
    state = json.loads(json.dumps(it.get_state()))
    assert state == {"global_batches": 23, "global_batch_size": make().global_batch, "batch_examples": B}
    tail = [next(it) for _ in range(5)]
    again = iter(make())
    again.set_state(state)
    for a, b in zip(tail, (next(again) for _ in range(5)), strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    # another mesh (rows in multiples of 7) or a longer run: other rows, the same examples from the same position
    for other in (make(row_multiple=7), _exact("align", examples, tok, table, horizon_steps=400)):
        it = iter(other)
        it.set_state(state)
        for a, b in zip(tail, (next(it) for _ in range(5)), strict=True):
            assert _segments(a, range(len(a["tokens"]))) == _segments(b, range(len(b["tokens"])))
    assert make(row_multiple=7).global_batch != make().global_batch
    # another batch size: refused, as padded data refuses it, even where it packs into as many rows
    bigger = make(batch_size=B + 2)
    with pytest.raises(ConfigError, match=rf"counts batches of {B} .*this run's are {B + 2}: a stage resumes"):
        iter(bigger).set_state(state)
    # the padded run's position resumes exact steps (a count of global batches both); grain's packer state does not
    padded = iter(_ds("align", examples, tok, table))
    _ = [next(padded) for _ in range(23)]
    it = iter(make())
    it.set_state(json.loads(json.dumps(padded.get_state())))
    assert _segments(next(it), range(make().global_batch)) == _segments(next(padded), range(B))
    rows_mode = iter(_ds("align", examples, tok, table, pack=True))
    next(rows_mode)
    with pytest.raises(ConfigError, match=r"is grain's packer state .*this run's data needs a count of global batches"):
        iter(make()).set_state(json.loads(json.dumps(rows_mode.get_state())))


def test_errors(tok, examples, table):
    with pytest.raises(ValueError, match="needs pack=True"):
        _ds("sft", examples, tok, table, pack_batch="exact")
    with pytest.raises(ValueError, match="give horizon_steps"):
        _exact("sft", examples, tok, table)
    with pytest.raises(ValueError, match="must be multiples of grad_accum"):
        _exact("sft", examples, tok, table, horizon_steps=4, batch_size=6, grad_accum=4)


def test_the_global_batch_is_the_same_array_on_one_process_and_on_two(tok, examples, table):
    """Every process packs each whole global micro-batch and keeps its share of the rows: the global step (processes'
    rows concatenated per micro-batch, as the Trainer's global array) is one process's, and holds the padded step's
    examples."""
    kw = {"horizon_steps": 12, "grad_accum": 2}
    # rows in multiples of 2 data-parallel devices a micro-batch (stages.common.row_multiple: grad_accum x
    # lcm(processes, devices) / processes)
    one = _exact("sft", examples, tok, table, batch_size=2 * B, shard_index=0, shard_count=1, row_multiple=4, **kw)
    procs = [_exact("sft", examples, tok, table, shard_index=p, shard_count=2, row_multiple=2, **kw) for p in (0, 1)]
    assert procs[0].global_batch == procs[1].global_batch == one.global_batch
    r = one.global_batch // 2  # rows a global micro-batch
    padded = _ds("sft", examples, tok, table, batch_size=2 * B)
    for a, b0, b1, g in itertools.islice(zip(padded, *procs, one, strict=True), 12):
        for m in range(2):  # micro-batch m: process 0's rows of it, then process 1's
            rows = slice(m * r // 2, (m + 1) * r // 2)
            for k in g:
                np.testing.assert_array_equal(np.concatenate([b0[k][rows], b1[k][rows]]), g[k][m * r:(m + 1) * r])
        assert _segments(g, range(2 * r)) == _segments(a, range(2 * B))
