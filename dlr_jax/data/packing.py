"""How many rows a stage's examples fill, padded one to a row or packed several to a row.

The packed pipeline (`data.pipeline.make_stage_dataset(pack=True)`) packs with grain's
`FirstFitPackIterDataset`: `num_packing_bins` rows are open at once, each sequence goes to the first
open row with room, and as soon as one sequence fits none of them every non-empty open row is emitted
and a fresh set is opened with that sequence. `first_fit_rows` replays exactly that on a list of
lengths, so a stage (its epoch-based schedule) and the planner (its stage totals) count the rows the
pipeline will make without building them.

A packed step consumes more examples than a padded one (`examples_per_row` of them a row), so "3 epochs"
is fewer packed steps; the FLOPs of a step do not change (a packed row is as long as a padded one and
attention is computed over the whole row either way), except for sft's dual branch, whose packed row computes
`data.ocr_rows.ocr_slots` OCR rows (`plan.totals.packed_ocr_step` counts them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np


def first_fit_rows(lengths: Sequence[int] | np.ndarray, max_len: int, num_bins: int) -> int:
    """Rows grain's first-fit packer emits for sequences of these lengths, in this order."""
    if max_len < 1 or num_bins < 1:
        raise ValueError(f"need max_len >= 1 and num_bins >= 1, got {max_len}, {num_bins}")
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and lengths.max() > max_len:
        raise ValueError(f"a sequence of {int(lengths.max())} tokens cannot be packed into rows of {max_len}")
    rows = 0
    free = np.full(num_bins, max_len, np.int64)
    for n in lengths.tolist():
        j = int(np.argmax(free >= n))
        if free[j] < n:  # fits no open row: the open rows go out, a fresh set starts with this sequence
            rows += int(np.count_nonzero(free < max_len))
            free[:] = max_len
            j = 0
        free[j] -= n
    return rows + int(np.count_nonzero(free < max_len))


@dataclasses.dataclass(frozen=True)
class PackStats:
    """One epoch of a stage's data in rows of `max_len` tokens: `examples` sequences of `tokens` tokens in
    all, one a row when padded, `rows` rows when packed."""

    examples: int
    tokens: int
    max_len: int
    rows: int

    @property
    def examples_per_row(self) -> float:
        return self.examples / max(self.rows, 1)

    @property
    def packed_efficiency(self) -> float:
        """Share of the packed rows' tokens that are not padding."""
        return self.tokens / max(self.rows * self.max_len, 1)

    @property
    def padded_efficiency(self) -> float:
        """Share of the padded rows' tokens that are not padding."""
        return self.tokens / max(self.examples * self.max_len, 1)

    def steps(self, num_epochs: float, batch_size: int, *, packed: bool, examples: int | None = None) -> int:
        """Optimizer steps of `num_epochs` passes at `batch_size` rows a step. `examples`: the epoch's size when
        these stats were measured on a sample of it (the rows scale with it)."""
        n = self.examples if examples is None else examples
        rows = n / self.examples_per_row if packed else n
        return max(1, math.ceil(num_epochs * rows / batch_size))

    def to_dict(self) -> dict[str, float]:
        return {"examples": self.examples, "tokens": self.tokens, "max_len": self.max_len, "rows": self.rows,
                "examples_per_row": self.examples_per_row, "packed_efficiency": self.packed_efficiency,
                "padded_efficiency": self.padded_efficiency}


def pack_stats(lengths: Sequence[int] | np.ndarray, max_len: int, num_bins: int, seed: int = 0) -> PackStats:
    """`PackStats` of the sequences that fit `max_len` (longer ones are dropped, as the pipeline drops them),
    packed in a seeded shuffled order as the pipeline shuffles them."""
    lengths = np.asarray(lengths, np.int64)
    lengths = lengths[lengths <= max_len]
    order = np.random.default_rng(seed).permutation(len(lengths))
    return PackStats(examples=len(lengths), tokens=int(lengths.sum()), max_len=max_len,
                     rows=first_fit_rows(lengths[order], max_len, num_bins))


def rows_for_examples(lengths: Sequence[int] | np.ndarray, max_len: int, batch_size: int, seed: int = 0, *,
                      multiple: int = 1, rounds: int = 4) -> tuple[int, PackStats]:
    """Rows a packed step takes to hold about `batch_size` examples (`data.pack_batch=examples`), and the epoch's
    `PackStats` with that many packing bins: R = round(batch_size / examples_per_row) to a multiple of `multiple`
    (at least one multiple). examples_per_row depends on the bins (R of them), so R is iterated to a fixed point
    (it settles in one or two rounds; `rounds` bounds a cycle, which then keeps the last R)."""
    if batch_size < 1 or multiple < 1:
        raise ValueError(f"need batch_size >= 1 and multiple >= 1, got {batch_size}, {multiple}")
    rows = max(multiple, batch_size // multiple * multiple)
    stats = pack_stats(lengths, max_len, rows, seed)
    for _ in range(rounds):
        want = max(1, round(batch_size / max(stats.examples_per_row, 1.0) / multiple)) * multiple
        if want == rows:
            break
        rows, stats = want, pack_stats(lengths, max_len, want, seed)
    return rows, stats
