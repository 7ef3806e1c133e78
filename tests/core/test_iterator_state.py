"""dlr_jax/core/iterator_state.py: each process resumes its own data position (Orbax writes the JSON item
from process 0 only; packed data differs per process)."""

from __future__ import annotations

import pytest

from dlr_jax.core.iterator_state import PER_PROCESS, gather_states, own_state

PACKED = [{"global_batches": 3, "packed": {"rows": 17}}, {"global_batches": 3, "packed": {"rows": 21}}]


def test_one_process_saves_its_state_as_it_is():
    assert gather_states({"global_batches": 5}, 1) == {"global_batches": 5}
    assert own_state({"global_batches": 5}, 0, 1) == {"global_batches": 5}


def test_each_process_takes_its_own_position():
    saved = {PER_PROCESS: PACKED}
    assert own_state(saved, 0, 2) == PACKED[0] and own_state(saved, 1, 2) == PACKED[1]


def test_equal_positions_resume_on_any_process_count():
    same = {"global_batches": 4, "global_batch_size": 16}
    assert own_state({PER_PROCESS: [same, same]}, 2, 4) == same
    assert own_state({PER_PROCESS: [same, same]}, 0, 1) == same


def test_differing_positions_on_another_process_count_are_refused():
    with pytest.raises(ValueError, match="saved by 2 processes, this run has 4"):
        own_state({PER_PROCESS: PACKED}, 0, 4)


def test_a_single_state_from_an_older_checkpoint_is_every_process_s():
    old = {"global_batches": 2, "global_batch_size": 8}
    assert own_state(old, 1, 2) == old
