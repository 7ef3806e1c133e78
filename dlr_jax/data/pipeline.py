"""grain pipelines that turn `Example`s into training batches for the textsft / align / sft stages.

    examples --length filter (counted, `data.items`)--> MapDataset.source -->
    .shuffle(seed) --> .repeat(num_epochs) (reshuffled every epoch) --> (sft's latent curriculum: each
    element's k from its stream position, `data.curriculum`) --> this process's rows of
    each global batch (`ProcessSlice`) --> .map(tokenise, formats.py)
    --> pad to the row width and .batch()                (pack=False; `row_width`: max_len or the longest example)
     or .to_iter_dataset() --> FirstFitPackIterDataset --> .batch()   (pack=True)
    (pack=True, pack_batch="exact", `exact_rows`: no process slice; the global stream .batch(batch_size x processes /
     grad_accum) --> tokenise, first-fit-decreasing into R rows, this process's R / processes of them --> .batch(
     grad_accum))
    --> optional .mpprefetch(num_workers)

A batch is a dict of numpy arrays, each [rows, row width] int32 (rows = batch_size; packed: the rows the mode
chooses, `StageData.global_batch` / processes; width max_len):

    tokens       token ids, right-padded with tok.pad_id
    loss_mask    1 where tokens[b, t] is a target (predicted from tokens[b, :t] of its segment)
    segment_ids  0 on padding, 1.. for the sequences packed into a row (always 1 without packing)
    positions    0.. restarting at every segment (0 on padding)

Stage sft's dual branch (`ocr_text_len > 0`) adds, per row (one example):

    ocr_targets    [b, ocr_text_len] the CoT as OCR-decoder char ids (`ocr_text.encode_target`:
                   chars, <eos>, <pad>...; longer CoTs are cut), or as `ocr_encode` writes it (an OCR-2
                   codebook's decoder: the checkpoint's tokens, <eos>, then -1)
    ocr_codes      [b, N] the example's latent code indices, left-padded with 0 to N = the most
                   codes any (length-filtered) example has, so every batch and process has one shape
    ocr_code_mask  [b, N] 1 on the real codes (the right end), 0 on the padding

Under a codebook that rendered one step a canvas (`ocr_unit="step"`, `codebook.render_unit=step`) the decoder
was trained to read one step's codes back as that step's text, so a row's target is one latent step j
(`curriculum.ocr_step`: drawn per example and epoch over the row's k latent steps, all of them without a
curriculum): ocr_codes are step j's codes, ocr_targets its `cot_view.step_views` text, and N the most codes
any step has.

Packed (`pack=True`), a row holds several examples, so these fields come per segment: [b, S, ...] with S =
`ocr_rows.ocr_slots` (the most sequences a row can hold), slot j - 1 holding segment j's fields, and
`ocr_segment_ids` [b, S] naming each slot's segment (0: unused, an empty row the OCR loss weighs 0); see
`ocr_rows` for why.

`batch_size` is the per-process batch (padded: the rows this iterator yields; packed: see pack_batch). One data
order for any topology: every process builds the same *global* stream (the length-filtered examples shuffled
with the seed, reshuffled every epoch) and global batch j is its elements [j G, (j + 1) G) with
G = batch_size x shard_count; process p reads rows [p batch_size, (p + 1) batch_size) of it. So a
global batch holds the same examples in the same order on 1 host or on 8.

The returned dataset's iterator has `get_state()` / `set_state()`: a run restored from a saved
state sees exactly the batches the uninterrupted run would have seen, given the same examples,
arguments and num_workers. Unpacked, the state counts global batches (`global_batches`), so it
resumes on a different number of processes (same global batch size) with the same next global
batch, and the batches are the same for any num_workers. Packed (`pack=True`), each process packs
its own slice of the global stream: the examples of global step j are those of the unpacked run's
global batch j only until a packer holds some back for a later row, so the rows, and the examples
per step, depend on the number of processes and of workers; the state is grain's, and resuming it
on another number of processes raises an error (under pack_batch="exact" a step is the unpacked run's global batch
packed, and the state counts global batches as unpacked). How many rows an epoch fills, padded or packed, comes with the
dataset (`StageData.pack`, `data.packing`: the packer replayed on the examples' lengths), which the stages'
epoch-based schedules use.

Worker processes: `num_workers > 0` runs tokenisation (and later rendering) in grain worker
processes. Everything passed to `.map` is a top-level callable or `functools.partial`, so it
pickles. A script that uses workers needs an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grain
import jax
import numpy as np
from grain.experimental import FirstFitPackIterDataset

from dlr_jax.config.root import PACK_BATCH
from dlr_jax.data.cot_view import cot_view
from dlr_jax.data.curriculum import Curriculum, ocr_step, step_counts
from dlr_jax.data.exact_rows import concat_groups, pack_group, rows_needed, stream_lengths
from dlr_jax.data.items import Item, Latents, build_sequence, fitting_items
from dlr_jax.data.ocr_rows import OCR_KEYS, as_slot, ocr_fields, ocr_slots, packed_ocr, slot_structs, step_texts
from dlr_jax.data.packing import PackStats, pack_stats, rows_for_examples
from dlr_jax.data.records import Example
from dlr_jax.data.stage_data import StageData, prefetch, read_options
from dlr_jax.text.ocr_text import encode_target
from dlr_jax.text.tokens import Tokenizer

log = logging.getLogger(__name__)

BATCH_KEYS = ("tokens", "loss_mask", "segment_ids", "positions")
_BATCH_READ_AHEAD = 4  # whole batches tokenised ahead by the reader threads (unpacked)
_PACK_READ_AHEAD = 64  # sequences tokenised ahead of the packer


# ---- per-element transforms (top-level, so grain workers can pickle them) --------------------


def _tokenise(
    item: Item, *, stage: str, tok: Tokenizer, mode: str, ocr: tuple[int, int, str, Any, str] | None = None
) -> dict[str, np.ndarray]:
    seq = build_sequence(stage, tok, item, mode)
    out = {"tokens": seq.tokens, "loss_mask": seq.loss_mask.astype(np.int32)}
    if ocr is not None:
        out |= ocr_fields(item, text_len=ocr[0], num_codes=ocr[1], view=ocr[2], encode=ocr[3], unit=ocr[4])
    return out


def _pad(seq: Mapping[str, np.ndarray], *, max_len: int, pad_id: int) -> dict[str, np.ndarray]:
    n = seq["tokens"].shape[0]
    if n > max_len:  # filter_by_length ran first, so this is a bug, not bad data
        raise AssertionError(f"sequence of {n} tokens reached padding with max_len={max_len}")
    out = {
        "tokens": np.full(max_len, pad_id, np.int32),
        "loss_mask": np.zeros(max_len, np.int32),
        "segment_ids": np.zeros(max_len, np.int32),
        "positions": np.zeros(max_len, np.int32),
    }
    out["tokens"][:n] = seq["tokens"]
    out["loss_mask"][:n] = seq["loss_mask"]
    out["segment_ids"][:n] = 1
    out["positions"][:n] = np.arange(n, dtype=np.int32)
    out |= {k: seq[k] for k in OCR_KEYS if k in seq}  # per example already, nothing to pad
    return out


def _assign_k(position: int, item: Item, *, curriculum: Curriculum, epoch_size: int) -> Item:
    """The curriculum's k for the item at global stream position `position` (all epochs, all processes' rows)."""
    k = curriculum.latent_steps(position, item.example.id, len(item.steps), epoch_size=epoch_size)
    return item._replace(k=k)


def _assign_ocr_step(position: int, item: Item, *, seed: int, epoch_size: int) -> Item:
    """The latent step of the item at global stream position `position` that its dual-branch row reads back (after
    the curriculum's k: one of the first k steps)."""
    k = len(item.steps) if item.k is None else item.k
    j = ocr_step(seed, item.example.id, position // max(epoch_size, 1), k)
    return item._replace(ocr_step=j)


def _pack_items(items: Sequence[Item], *, stage: str, tok: Tokenizer, mode: str, ocr: Any, plan: Mapping[str, int],
                rows: int, max_len: int, slots: int, slot_pads: Mapping[str, int] | None, shard_index: int,
                shard_count: int) -> dict[str, np.ndarray]:
    # data.pack_batch=exact: one global micro-batch's examples as `rows` packed rows, planned on each example's length
    # in `plan` (its longest variant under a curriculum), as `exact_rows.rows_needed` replayed them; this process's
    # share of them. Every process packs the whole micro-batch (the same rows everywhere), so the global array is
    # the same on any number of processes.
    seqs = [_tokenise(it, stage=stage, tok=tok, mode=mode, ocr=ocr) for it in items]
    packed = pack_group(seqs, [plan[it.example.id] for it in items], rows=rows, max_len=max_len, pad_id=tok.pad_id,
                        slots=slots, slot_pads=slot_pads)
    share = rows // shard_count
    return {k: v[shard_index * share:(shard_index + 1) * share] for k, v in packed.items()}


def _rename_packed(row: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    ocr = packed_ocr(dict(row)) if OCR_KEYS[0] in row else {}
    return ocr | {
        "tokens": row["tokens"].astype(np.int32),
        "loss_mask": row["loss_mask"].astype(np.int32),
        "segment_ids": row["tokens_segment_ids"].astype(np.int32),
        "positions": row["tokens_positions"].astype(np.int32),
    }


def make_stage_dataset(
    stage: str,
    examples: Iterable[Example],
    tok: Tokenizer,
    *,
    batch_size: int,
    max_len: int,
    seed: int,
    latents: Latents | None = None,
    mode: str = "cot",
    pack: bool = False,
    shard_index: int | None = None,
    shard_count: int | None = None,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    num_workers: int = 0,
    num_packing_bins: int | None = None,
    num_threads: int = 2,
    ocr_text_len: int = 0,
    ocr_view: str = "cot",
    ocr_encode: Any = None,
    vocab_size: int | None = None,
    curriculum: Curriculum | None = None,
    ocr_unit: str = "chain",
    pad_to: str = "max_len",
    pack_batch: str = "rows",
    row_multiple: int = 1,
    grad_accum: int = 1,
    horizon_steps: int | None = None,
) -> StageData:
    """Batches for `stage` (see the module docstring for the layout and the batch dict).

    examples: for align / sft, `latents` must hold every example's id (e.g. a LatentTable).
    mode: textsft only, "cot" or "direct".

    shard_index / shard_count: default to jax.process_index() / jax.process_count(), read at call
    time. num_epochs: None repeats forever. drop_remainder: drop the last partial batch (only
    reached when num_epochs is finite). num_workers: 0 runs in-process; > 0 uses grain worker
    processes. num_packing_bins: rows the first-fit packer fills at once (default batch_size).
    num_threads: grain reader threads per process that tokenise ahead of the consumer (0 = on
    demand, in the caller's thread). ocr_text_len: > 0 adds stage sft's dual-branch fields
    (`OCR_KEYS`, see the module docstring; packed: per segment); needs stage sft. ocr_view: what of each CoT
    the OCR targets hold (`codebook.render_view`, `cot_view`). ocr_encode: `(text, length) -> (ids [length],
    cut)`, a picklable top-level callable; None = `ocr_text.encode_target` (characters). vocab_size: the model's
    embedding rows; every example's ids are checked against it up front (`check_token_range`). ocr_unit:
    `codebook.render_unit`; `step` makes each row's OCR target one latent step (see the module docstring).
    pad_to: padded rows' width (`data.pad_to`, `row_width`): "max_len", or "longest" = the longest kept example
    rounded up to ROW_MULTIPLE (at most max_len). Packed rows are always max_len wide.
    pack_batch (`data.pack_batch`, packed only): "rows" = `batch_size` rows a step; "examples" = `batch_size` is the
    examples a step should hold on average, in r = `rows_for_examples` rows (a multiple of `row_multiple`, r
    packing bins; the returned `StageData.global_batch` counts rows, `examples_per_step` about batch_size x
    shard_count). The process slice still takes `batch_size` examples a process per global batch of the stream.
    "exact" (`data.exact_rows`): every step holds exactly the padded step's examples, each of its `grad_accum`
    micro-batches packed into the same number of rows r (the most the run needs, replayed over `horizon_steps` global
    batches, or the whole stream when num_epochs is finite; a multiple of row_multiple / grad_accum); the data
    resumes by global batches as padded data does.
    curriculum: stage sft's latent curriculum (`data.curriculum`): each element's k is set from its position in the
    global stream; a stagewise one needs the schedule's length before the first batch
    (`StageData.schedule_curriculum`).
    """
    if batch_size < 1 or max_len < 1:
        raise ValueError(f"batch_size and max_len must be >= 1, got {batch_size}, {max_len}")
    if pack_batch not in PACK_BATCH:
        raise ValueError(f"pack_batch must be {'|'.join(PACK_BATCH)}, got {pack_batch!r}")
    if pack_batch in ("examples", "exact") and not pack:
        raise ValueError(f"pack_batch={pack_batch!r} counts the examples of packed rows: it needs pack=True")
    if pack and pack_batch == "exact" and (batch_size % grad_accum or row_multiple > 1 and row_multiple % grad_accum):
        raise ValueError(f"pack_batch='exact' packs each of the {grad_accum} micro-batches of a process's "
                         f"{batch_size} examples apart: batch_size and row_multiple ({row_multiple}) must be "
                         "multiples of grad_accum")
    if pack and pack_batch == "exact" and horizon_steps is None and num_epochs is None:
        raise ValueError("pack_batch='exact' sizes its rows on the batches the run reads: give horizon_steps (the "
                         "stage's steps) or a finite num_epochs")
    shard_index = jax.process_index() if shard_index is None else shard_index
    shard_count = jax.process_count() if shard_count is None else shard_count
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
    items, lengths, _ = fitting_items(
        stage, examples, tok, max_len=max_len, latents=latents, mode=mode, vocab_size=vocab_size,
        curriculum=curriculum,
    )
    ocr = None
    if ocr_text_len > 0:
        if stage != "sft":
            raise ValueError(f"ocr_text_len (the sft dual branch) needs stage 'sft', got stage={stage!r}")
        # Over every kept example, before sharding: the same N on every process and every batch.
        encode = ocr_encode or encode_target
        unit = "characters" if ocr_encode is None else "tokens"
        if ocr_unit == "step":
            items = [it if it.steps else it._replace(steps=step_counts(latents or {}, it.example.id)) for it in items]
            texts = [t for it in items for t in step_texts(it, ocr_view)]  # every span pairs with its CoT's steps
            ocr = (ocr_text_len, max([1, *(c for it in items for c in it.steps)]), ocr_view, encode, ocr_unit)
            cut = sum(encode(t, ocr_text_len)[1] for t in texts)
            (log.warning if cut else log.info)(
                "sft dual branch (one step a row): %d of %d CoT steps are longer than ocr_text_len - 1 = %d %s; "
                "their OCR targets are cut", cut, len(texts), ocr_text_len - 1, unit)
        elif ocr_unit == "chain":
            ocr = (ocr_text_len, max([1, *(len(it.codes) for it in items)]), ocr_view, encode, ocr_unit)
            cut = sum(encode(cot_view(it.example.cot, ocr_view, example_id=it.example.id), ocr_text_len)[1]
                      for it in items)
            (log.warning if cut else log.info)(
                "sft dual branch: %d of %d CoTs are longer than ocr_text_len - 1 = %d %s; their OCR "
                "targets are cut", cut, len(items), ocr_text_len - 1, unit)
        else:
            raise ValueError(f"ocr_unit must be chain or step (codebook.render_unit), got {ocr_unit!r}")
    if len(items) < shard_count:
        fit = f"{len(items)} examples fit max_len={max_len}"
        raise ValueError(f"shard {shard_index}/{shard_count} is empty: {fit}")

    exact = None
    if pack and pack_batch == "exact":
        plan = {}  # each example's planned length: its longest variant (ids are unique per stage: latents key on them)
        for it, n in zip(items, lengths, strict=True):
            plan[it.example.id] = max(n, plan.get(it.example.id, 0))
        # a global micro-batch, packed whole by every process; its rows split over the processes and the
        # data-parallel devices: a multiple of lcm(processes, data-parallel devices) = row_multiple / grad_accum x
        # processes (stages.common.row_multiple)
        group, per = batch_size * shard_count // grad_accum, max(1, row_multiple // grad_accum) * shard_count
        # (+ a few batches: a consumer that reads one ahead of its last step still finds rows that fit)
        count = len(items) * num_epochs if horizon_steps is None else (horizon_steps + 4) * batch_size * shard_count
        stream = stream_lengths([plan[it.example.id] for it in items], seed, num_epochs, count)
        rows, segments = rows_needed(stream, group, max_len, per)
        pads = slot_structs(segments, ocr_text_len, ocr[3])[1] if ocr is not None else None
        exact = {"plan": plan, "rows": rows, "slots": segments if ocr is not None else 0, "slot_pads": pads}

    def assemble(cur: Curriculum | None) -> StageData:
        # A closure, so that StageData.schedule_curriculum can rebuild the stream once the stage knows its length.
        ds = grain.MapDataset.source(items).shuffle(seed=seed).repeat(num_epochs)
        if cur is not None:  # before the process slice: k follows the global position, whatever the process count
            ds = ds.map_with_index(functools.partial(_assign_k, curriculum=cur, epoch_size=len(items)))
        if ocr is not None and ocr_unit == "step":  # after k: the drawn step is one of the row's latent steps
            ds = ds.map_with_index(functools.partial(_assign_ocr_step, seed=seed, epoch_size=len(items)))
        if exact is not None:  # the global stream: every process packs whole global micro-batches
            return _exact_data(ds, exact, cur, assemble, stage=stage, tok=tok, mode=mode, ocr=ocr,
                               lengths=lengths, max_len=max_len, batch_size=batch_size, grad_accum=grad_accum,
                               shard_index=shard_index, shard_count=shard_count, drop_remainder=drop_remainder,
                               num_threads=num_threads, num_workers=num_workers)
        ds = ProcessSlice(ds, batch_size, shard_index, shard_count)
        ds = ds.map(functools.partial(_tokenise, stage=stage, tok=tok, mode=mode, ocr=ocr))
        if pack:
            if pack_batch == "examples":
                rows, stats = rows_for_examples(lengths, max_len, batch_size, seed, multiple=row_multiple)
                held = rows * stats.examples_per_row
                if abs(held - batch_size) > 0.15 * batch_size:  # whole multiples of rows cannot come closer
                    log.warning(
                        "data.pack_batch=examples: %d rows a step hold about %.0f examples, not batch_size %d: rows "
                        "come in multiples of %d (grad_accum x data-parallel devices) and a row holds %.2f; a "
                        "batch_size near a multiple of %.0f keeps the step's examples", rows, held, batch_size,
                        row_multiple, stats.examples_per_row, row_multiple * stats.examples_per_row)
            else:
                rows = batch_size
                # Each process packs its own slice with its own bins; replayed here on the global stream with as
                # many bins a process has, which counts the rows of every process together closely enough for a
                # schedule.
                stats = pack_stats(lengths, max_len, num_packing_bins or batch_size, seed)
            lengths_struct, padding = {"tokens": max_len, "loss_mask": max_len}, {"tokens": tok.pad_id, "loss_mask": 0}
            if ocr is not None:  # one OCR row per segment, placed by the packer (ocr_rows)
                ds = ds.map(as_slot)
                slots, pads = slot_structs(ocr_slots(lengths, max_len), ocr_text_len, ocr[3])
                lengths_struct, padding = lengths_struct | slots, padding | pads
            it = FirstFitPackIterDataset(
                ds.to_iter_dataset(read_options(num_threads, _PACK_READ_AHEAD)),
                length_struct=lengths_struct,
                num_packing_bins=num_packing_bins or rows,
                seed=seed,
                meta_features=("loss_mask",),
                padding_struct=padding,
            )
            it = it.map(_rename_packed).batch(rows, drop_remainder=drop_remainder)
            return StageData(lambda start: prefetch(it, num_workers), rows * shard_count, shard_count,
                             packed=True, examples=len(items), pack=stats, curriculum=cur, rebuild=assemble,
                             pack_batch=pack_batch, batch_examples=batch_size * shard_count)
        width = row_width(lengths, max_len, pad_to)
        ds = ds.map(functools.partial(_pad, max_len=width, pad_id=tok.pad_id))
        batches = ds.batch(batch_size, drop_remainder=drop_remainder)

        def from_batch(start: int) -> Any:
            # Resuming = reading the same (global-order) batch dataset from global batch `start` on.
            tail = batches[start:] if start else batches
            return prefetch(tail.to_iter_dataset(read_options(num_threads, _BATCH_READ_AHEAD)), num_workers)

        return StageData(from_batch, batch_size * shard_count, shard_count, packed=False, examples=len(items),
                         pack=PackStats(len(items), int(sum(lengths)), width, rows=len(items)), curriculum=cur,
                         rebuild=assemble)

    return assemble(curriculum)


def _exact_data(ds: grain.MapDataset, exact: Mapping[str, Any], cur: Curriculum | None, rebuild: Any, *, stage: str,
                tok: Tokenizer, mode: str, ocr: Any, lengths: Sequence[int], max_len: int, batch_size: int,
                grad_accum: int, shard_index: int, shard_count: int, drop_remainder: bool, num_threads: int,
                num_workers: int) -> StageData:
    # data.pack_batch=exact (`data.exact_rows`): the global stream in global micro-batches (batch_size x processes /
    # grad_accum examples), each packed into R rows by every process, which keeps its R / processes of them.
    rows = exact["rows"]
    groups = ds.batch(batch_size * shard_count // grad_accum, drop_remainder=drop_remainder, batch_fn=list)
    groups = groups.map(functools.partial(_pack_items, stage=stage, tok=tok, mode=mode, ocr=ocr, plan=exact["plan"],
                                          rows=rows, max_len=max_len, slots=exact["slots"],
                                          slot_pads=exact["slot_pads"], shard_index=shard_index,
                                          shard_count=shard_count))
    batches = groups.batch(grad_accum, drop_remainder=drop_remainder, batch_fn=concat_groups)

    def from_batch(start: int) -> Any:
        tail = batches[start:] if start else batches
        return prefetch(tail.to_iter_dataset(read_options(num_threads, _BATCH_READ_AHEAD)), num_workers)

    step_rows = rows * grad_accum
    epoch_steps = len(lengths) / (batch_size * shard_count)
    stats = PackStats(len(lengths), int(sum(lengths)), max_len, rows=max(1, round(epoch_steps * step_rows)))
    return StageData(from_batch, step_rows, shard_count, packed=True, examples=len(lengths), pack=stats,
                     curriculum=cur, rebuild=rebuild, pack_batch="exact", batch_examples=batch_size * shard_count)


ROW_MULTIPLE = 16


def row_width(lengths: Sequence[int], max_len: int, pad_to: str) -> int:
    """Padded rows' width: max_len, or (pad_to="longest") the longest of `lengths` (every kept example of the stage,
    over all processes, so every process and every batch gets one shape) rounded up to ROW_MULTIPLE, at most
    max_len. Pad tokens sit after an example's last token, are out of its loss and, causal, out of its attention."""
    if pad_to == "max_len":
        return max_len
    if pad_to != "longest":
        raise ValueError(f"pad_to must be longest or max_len, got {pad_to!r}")
    longest = max(lengths, default=1)
    return min(max_len, -(-longest // ROW_MULTIPLE) * ROW_MULTIPLE)


class ProcessSlice(grain.MapDataset):
    """Process `index` of `count`'s rows of every global batch of `parent`: element i is parent element
    (i // batch) * batch * count + index * batch + i % batch. A final partial global batch (finite
    epochs) is split in order: the first processes get its rows, later ones fewer or none."""

    def __init__(self, parent: grain.MapDataset, batch: int, index: int, count: int):
        super().__init__(parent)
        self._batch, self._index, self._count = batch, index, count
        total = len(parent)
        full, rest = divmod(total, batch * count)
        self._length = full * batch + min(max(rest - index * batch, 0), batch)

    def __len__(self) -> int:
        return self._length

    def _parent_index(self, i: int) -> int:
        j, k = divmod(i, self._batch)
        return j * self._batch * self._count + self._index * self._batch + k

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[self._parent_index(index)]

    def __str__(self) -> str:
        return f"ProcessSlice(batch={self._batch}, index={self._index}, count={self._count})"


def describe(batch: Mapping[str, Any]) -> str:
    """One line of shapes / dtypes, for logs."""
    return ", ".join(f"{k}: {np.asarray(v).dtype}{list(np.shape(v))}" for k, v in batch.items())
