"""The dual branch's OCR fields of one SFT row (`OCR_KEYS`; `dlr_jax.data.pipeline`'s docstring lays out the
batch): the latent codes the OCR decoder reads, left-padded, and the text it must read back from them. Under
`codebook.render_unit=step` a row reads back one latent step (the one `item.ocr_step` names), which is what a step
codebook's decoder was trained on; under `chain` the whole span (or, with a latent curriculum, its first k steps).
Packed rows (data.pack=true) carry these fields per segment, `slots` of them a row, placed by the packer (the last
section says how and why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dlr_jax.data.cot_view import cot_view, render_texts
from dlr_jax.data.curriculum import latent_codes, split_cot
from dlr_jax.text.ocr_text import encode_target

# `item` below is a `dlr_jax.data.items.Item` (example, codes, steps, k, ocr_step).
OCR_KEYS = ("ocr_targets", "ocr_codes", "ocr_code_mask")


def pad_target(encode: Any, text_len: int) -> int:
    """The id `encode` pads a target with (its last entry for an empty text): a row of it is read back from nothing,
    and every OCR loss weighs it 0."""
    return int((encode or encode_target)("", text_len)[0][-1])


def ocr_fields(item: Any, *, text_len: int, num_codes: int, view: str = "cot",
               encode: Any = None, unit: str = "chain") -> dict[str, np.ndarray]:
    """One row's `OCR_KEYS` (see the module docstring): targets (the CoT as the codebook rendered it,
    `cot_view`, encoded by `encode(text, text_len) -> (ids, cut)`, default `encode_target`), codes
    left-padded to num_codes, mask. unit: `codebook.render_unit`; under `step` the target is the latent step
    `item.ocr_step` alone (`step_ocr_fields`)."""
    if unit == "step":
        return step_ocr_fields(item, text_len=text_len, num_codes=num_codes, view=view, encode=encode)
    latent, cot = item.codes, item.example.cot
    if item.k:  # latent curriculum: the decoder reads back the k latent steps only
        latent = latent_codes(item.codes, item.steps, item.k)
        cot, _ = split_cot(cot, len(item.steps), item.k, example_id=item.example.id)
    codes, mask = left_pad(latent, num_codes, item.example.id)
    target = cot_view(cot, view, example_id=item.example.id)
    encode = encode or encode_target
    targets = encode(target, text_len)[0]
    if item.k == 0 and text_len > 1:
        # No latent step, nothing to read back: every target is the encoder's padding (its last entry for an
        # empty text), which the OCR losses weigh 0. The codes stay the whole span's, so no row attends to nothing.
        targets = np.full_like(targets, pad_target(encode, text_len))
    return {"ocr_targets": targets, "ocr_codes": codes, "ocr_code_mask": mask}


def step_texts(item: Any, view: str) -> list[str]:
    """The texts of `item`'s latent steps as a step codebook rendered them (`render_texts` under `step`), one per
    step of its span; raises when the span's steps and the CoT's do not pair up."""
    texts = render_texts(item.example.cot, view, "step", example_id=item.example.id)
    steps = item.steps or (len(item.codes),)
    if len(texts) != len(steps):
        raise ValueError(
            f"example {item.example.id!r}: its latent span has {len(steps)} steps but the codebook renders "
            f"{len(texts)} (cot_view.step_views under codebook.render_view={view}); the dual branch reads one step's "
            "codes back as that step's text, so the latents must be exported under codebook.render_unit=step")
    return texts


def step_ocr_fields(item: Any, *, text_len: int, num_codes: int, view: str, encode: Any) -> dict[str, np.ndarray]:
    # One latent step's codes -> that step's text, what a step codebook's decoder was trained on.
    steps = item.steps or (len(item.codes),)
    k = len(steps) if item.k is None else item.k
    texts = step_texts(item, view)
    encode = encode or encode_target
    if k and item.ocr_step is None:
        raise ValueError(f"example {item.example.id!r}: no latent step drawn for its OCR target (_assign_ocr_step)")
    j = item.ocr_step if k else 0
    if not 0 <= j < max(k, 1):
        raise ValueError(f"example {item.example.id!r}: OCR step {j} is not one of its {k} latent steps")
    start = sum(steps[:j])
    codes, mask = left_pad(item.codes[start:start + steps[j]], num_codes, item.example.id)
    targets = encode(texts[j], text_len)[0]
    if not k and text_len > 1:
        # No latent step, nothing to read back: every target is the padding (weighed 0); step 0's codes keep
        # the row from attending to nothing.
        targets = np.full_like(targets, pad_target(encode, text_len))
    return {"ocr_targets": targets, "ocr_codes": codes, "ocr_code_mask": mask}


def left_pad(latent: Sequence[int], num_codes: int, example_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, mask) int32 [num_codes]: `latent` right-aligned (the decoder's prefix ends where the text starts)."""
    n = len(latent)
    if n > num_codes:
        raise ValueError(f"example {example_id!r} has {n} latent codes, more than num_codes={num_codes}")
    codes = np.zeros(num_codes, np.int32)
    mask = np.zeros(num_codes, np.int32)
    codes[num_codes - n :] = latent
    mask[num_codes - n :] = 1
    return codes, mask


# ---- packed rows (data.pack=true): one OCR row per segment, `slots` of them per token row ----------------------
#
# A packed row holds several examples (segments 1..s), and the OCR branch reads one example's codes at a time, so a
# packed batch carries the OCR fields per segment: [b, slots, ...], slot j - 1 holding segment j's fields, unused
# slots an empty row (code 0 unmasked, every target the encoder's padding) that every OCR sum weighs 0. The design is
# grain's packer placing them itself: each example's fields enter it as a length-1 sequence of a feature `slots`
# long, so they land in the same bin, at the index of the example's segment, by the very add that places its tokens:
# the pairing cannot drift from the tokens'. `slots` is fixed for the dataset (no recompiles) and is the most
# segments a row can hold (max_len // the shortest sequence), so the cap never changes what the packer does (with a
# latent curriculum the lengths are each example's longest row, so a shorter mix may meet the cap: the packer then
# opens another row, which changes no loss). The loss (`stages.sft.ocr_terms`) reads the [b, slots] rows as
# b * slots OCR rows; since every OCR quantity it takes is a sum over OCR rows (NLL, target count, correct count),
# packed and padded batches of the same examples give the same OCR loss and gradients. (Character dropout,
# codebook.char_dropout, draws its mask over the rows it is given: the same in distribution, not the same draw.)
# The cost: `slots` OCR rows a token row, the unused ones computed for nothing.


def ocr_slots(lengths: Sequence[int], max_len: int) -> int:
    """OCR rows per packed token row: the most sequences of these lengths that fit one row of max_len tokens."""
    return max(1, max_len // max(1, min(lengths, default=max_len)))


def as_slot(seq: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One tokenised example with its `OCR_KEYS` as a length-1 sequence ([1, ...]): the unit the packer places."""
    return seq | {k: seq[k][None] for k in OCR_KEYS}


def slot_structs(slots: int, text_len: int, encode: Any = None) -> tuple[dict[str, int], dict[str, int]]:
    """(length_struct, padding_struct) of the `OCR_KEYS` for grain's packer: `slots` per row; an unused slot's
    targets are the encoder's padding (its last entry for an empty text), its codes 0 and all unmasked (so it
    attends to something: no NaN that a zero weight could not cancel)."""
    pad = pad_target(encode, text_len)
    return ({k: slots for k in OCR_KEYS},
            {"ocr_targets": pad, "ocr_codes": 0, "ocr_code_mask": 1})


def packed_ocr(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A packed row's OCR fields [slots, ...] and `ocr_segment_ids` [slots]: the segment each slot holds (0 unused)."""
    out = {k: row[k].astype(np.int32) for k in OCR_KEYS}
    return out | {"ocr_segment_ids": row["ocr_codes_segment_ids"].astype(np.int32)}
