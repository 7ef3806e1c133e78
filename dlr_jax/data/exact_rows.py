"""`data.pack_batch=exact`: packed steps that hold exactly the padded steps' examples.

The padded pipeline's global step is `batch_size` x processes examples, read in global stream order
(`data.pipeline`). Here the same step's examples are packed instead of padded: the global batch is cut into
grad_accum consecutive groups (global micro-batches), and each group is packed first-fit-decreasing into `rows` rows
of max_len tokens, the rows it does not fill left empty (segment 0: no loss, no OCR row); every process packs the
whole group and keeps its rows / processes of them, so the global batch is the same array on any number of processes.
`rows` is fixed for the run (no recompiles): the most rows any group of the run needs, found by replaying the packer
on the examples' lengths in the stream's order (`rows_needed`), as is the dual branch's OCR slots a row (the most
segments a row gets). So packed step j holds padded step j's examples (a micro-batch holds a contiguous slice of the
global batch, where a padded one holds every process's slice of it: the Trainer sums the loss and its weight over
the whole step, so the step is the same), and since every loss is a sum over targets (`stages.common.lm_loss`; the
dual branch's OCR terms per segment slot, `data.ocr_rows`), a packed run trains what the padded run trains, step for
step, on fewer and fuller rows.

With a latent curriculum an example's sequence changes length with k; the rows are planned on each example's
longest variant (`items.fitting_items`), so a shorter actual row always fits where its plan put it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from dlr_jax.data.ocr_rows import OCR_KEYS


def ffd_bins(lengths: Sequence[int], max_len: int) -> list[list[int]]:
    """First-fit-decreasing: indices into `lengths`, longest first (ties: the earlier first), each to the first row
    with room; the rows in the order they were opened, each row's indices in the order they went in."""
    free: list[int] = []
    bins: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = int(lengths[i])
        if n > max_len:
            raise ValueError(f"a sequence of {n} tokens cannot be packed into rows of {max_len}")
        j = next((j for j, room in enumerate(free) if room >= n), len(free))
        if j == len(free):  # fits no open row: open one
            free.append(max_len)
            bins.append([])
        free[j] -= n
        bins[j].append(i)
    return bins


def stream_lengths(lengths: Sequence[int], seed: int, num_epochs: int | None, count: int) -> np.ndarray:
    """The first `count` elements' lengths of the global stream `make_stage_dataset` reads: `lengths` (one per kept
    item) through the same shuffle and repeat (grain's permutation, so the order is the pipeline's own)."""
    ds = grain.MapDataset.source(np.asarray(lengths, np.int64)).shuffle(seed=seed).repeat(num_epochs)
    count = min(count, len(ds))
    return np.fromiter((ds[i] for i in range(count)), np.int64, count)


def rows_needed(stream: np.ndarray, group: int, max_len: int, multiple: int = 1) -> tuple[int, int]:
    """(the most rows first-fit-decreasing needs for any `group` consecutive elements of `stream`, rounded up to a
    multiple of `multiple`; the most sequences it puts in one row): the global micro-batches the pipeline packs, and
    how many OCR slots a row of them needs (sft's dual branch: one a segment)."""
    rows = segments = 1
    for start in range(0, len(stream), group):
        bins = ffd_bins(stream[start:start + group].tolist(), max_len)
        rows, segments = max(rows, len(bins)), max(segments, *map(len, bins), 1)
    return -(-rows // multiple) * multiple, segments


def pack_group(seqs: Sequence[Mapping[str, np.ndarray]], plan_lengths: Sequence[int], *, rows: int, max_len: int,
               pad_id: int, slots: int = 0, slot_pads: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """One group's tokenised sequences (`pipeline._tokenise`) as `rows` packed rows: the batch dict of packed data
    (`data.pipeline`'s docstring), [rows, max_len] token fields and, with the dual branch (`slots` > 0), the OCR
    fields per segment slot [rows, slots, ...] and `ocr_segment_ids` [rows, slots]. The rows are planned on
    `plan_lengths` (each sequence's planned length, at least its own); raises if they need more than `rows`."""
    bins = ffd_bins(plan_lengths, max_len)
    if len(bins) > rows:
        raise RuntimeError(f"a step's group of {len(seqs)} examples needs {len(bins)} packed rows, more than the "
                           f"{rows} the run's batches need (data.exact_rows.rows_needed over horizon_steps): the run "
                           "reads past the batches its rows were sized on")
    out = {"tokens": np.full((rows, max_len), pad_id, np.int32), "loss_mask": np.zeros((rows, max_len), np.int32),
           "segment_ids": np.zeros((rows, max_len), np.int32), "positions": np.zeros((rows, max_len), np.int32)}
    if slots:
        first = seqs[0]
        for k in OCR_KEYS:
            out[k] = np.full((rows, slots, *first[k].shape), (slot_pads or {})[k], np.int32)
        out["ocr_segment_ids"] = np.zeros((rows, slots), np.int32)
    for r, members in enumerate(bins):
        if slots and len(members) > slots:
            raise RuntimeError(f"a packed row holds {len(members)} sequences, more than the {slots} OCR slots the "
                               "run's batches need: the run reads past the batches its rows were sized on")
        at = 0
        for s, i in enumerate(members):
            seq = seqs[i]
            n = len(seq["tokens"])
            if n > plan_lengths[i]:
                raise ValueError(f"sequence {i} has {n} tokens, more than its planned {plan_lengths[i]}")
            out["tokens"][r, at:at + n] = seq["tokens"]
            out["loss_mask"][r, at:at + n] = seq["loss_mask"]
            out["segment_ids"][r, at:at + n] = s + 1
            out["positions"][r, at:at + n] = np.arange(n, dtype=np.int32)
            if slots:
                for k in OCR_KEYS:
                    out[k][r, s] = seq[k]
                out["ocr_segment_ids"][r, s] = s + 1
            at += n
    return out


def concat_groups(groups: Sequence[Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """A process's step: its grad_accum groups' rows one after another (the Trainer's micro-batch m is rows
    [m rows, (m + 1) rows), the padded micro-batch's examples)."""
    return {k: np.concatenate([g[k] for g in groups]) for k in groups[0]}
