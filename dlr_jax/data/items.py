"""Which examples become which sequences: the textsft / align / sft stages' rows before any batching.

An `Item` is one element of a stage's stream: the example, its latent codes (none for textsft) and, under stage
sft's latent curriculum, its codes per latent step and the k its row writes as latents. `build_sequence` lays an
item out as the stage's token sequence (`data.formats`); `make_items` pairs examples with their latents and names
any that have none.

`fitting_items` / `filter_by_length` keep the examples whose sequence fits `max_len` (with a curriculum, whose
longest row over every k the schedule can give them does), logging how many they drop ("dropped N of M examples
longer than max_len=...") so that no example disappears silently, and check every token id against the model's
embedding table up front (`check_token_range`): JAX's gathers return NaN for an id out of range instead of failing.

They sit apart from the grain pipeline (`data.pipeline`, which streams the kept items into batches) because the
planner measures a stage's sequence lengths with the same layout without building a dataset (`plan.lengths`), and
the lengths this filter returns also size the packed epoch (`data.packing`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from dlr_jax.data import formats
from dlr_jax.data.curriculum import Curriculum, latent_codes, split_cot, step_counts
from dlr_jax.data.records import Example
from dlr_jax.text.tokens import Tokenizer

log = logging.getLogger(__name__)

STAGES = ("textsft", "align", "sft")
Latents = Mapping[str, Sequence[int]]


class Item(NamedTuple):
    """One source element: the example and its latent codes (empty for textsft).

    With a latent curriculum (`data.curriculum`, stage sft): steps, the codes of each of the latent span's steps
    (`LatentTable.step_counts`); k, how many of them this row writes as latents (the rest as text), set per stream
    position by the schedule. k None: the whole span is latent (the paper's row). ocr_step: under a step codebook's
    dual branch, the latent step the row's OCR target reads (`data.pipeline`'s `_assign_ocr_step`)."""

    example: Example
    codes: tuple[int, ...]
    steps: tuple[int, ...] = ()
    k: int | None = None
    ocr_step: int | None = None


def _check_stage(stage: str, latents: Latents | None) -> None:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; data pipelines exist for {STAGES}")
    if stage != "textsft" and latents is None:
        raise ValueError(
            f"stage {stage!r} needs latents (a LatentTable from dlr_jax.data.latents.read_latents, "
            "or random_latents before a codebook exists)"
        )


def build_sequence(stage: str, tok: Tokenizer, item: Item, mode: str = "cot") -> formats.Sequence:
    """The stage's layout (see `dlr_jax.data.formats`) for one item."""
    ex = item.example
    if stage == "textsft":
        return formats.textsft_sequence(tok, ex.question, ex.cot, ex.answer, mode)
    if stage == "align":
        return formats.align_sequence(tok, item.codes, ex.cot)
    if stage == "sft":
        if item.k is None:
            return formats.sft_sequence(tok, ex.question, item.codes, ex.answer)
        _, text = split_cot(ex.cot, len(item.steps), item.k, example_id=ex.id)
        return formats.mixed_sequence(tok, ex.question, latent_codes(item.codes, item.steps, item.k), text, ex.answer)
    raise ValueError(f"unknown stage {stage!r}; data pipelines exist for {STAGES}")


def make_items(stage: str, examples: Iterable[Example], latents: Latents | None = None,
               curriculum: Curriculum | None = None) -> list[Item]:
    """Pairs each example with its latent codes (and, with a curriculum, their codes per step); raises naming the
    ids that have none."""
    _check_stage(stage, latents)
    if curriculum is not None and stage != "sft":
        raise ValueError(f"the latent curriculum is stage sft's, not {stage!r}'s")
    examples = list(examples)
    if stage == "textsft":
        return [Item(ex, ()) for ex in examples]
    assert latents is not None
    missing = [ex.id for ex in examples if ex.id not in latents]
    if missing:
        raise KeyError(
            f"{len(missing)} of {len(examples)} examples have no latents (first ids: {missing[:5]}); "
            "export latents for this split or pass the matching latents file"
        )
    if curriculum is not None:
        return [Item(ex, tuple(latents[ex.id]), step_counts(latents, ex.id)) for ex in examples]
    return [Item(ex, tuple(latents[ex.id])) for ex in examples]


def filter_by_length(
    stage: str,
    examples: Iterable[Example],
    tok: Tokenizer,
    *,
    max_len: int,
    latents: Latents | None = None,
    mode: str = "cot",
    vocab_size: int | None = None,
    curriculum: Curriculum | None = None,
) -> tuple[list[Example], int]:
    """(examples whose sequence fits in max_len tokens, number dropped); the count is logged as
    "dropped N of M examples longer than max_len=..." so no example disappears silently.

    vocab_size: rows of the model's embedding table; any token id outside [0, vocab_size) raises
    `TokenRangeError` naming the example, the id and the table size (before any step runs: JAX's
    gathers return NaN for such ids instead of failing). curriculum: stage sft's latent curriculum; an example
    fits when its longest row over every k the schedule can give it does."""
    kept, _, dropped = fitting_items(stage, examples, tok, max_len=max_len, latents=latents, mode=mode,
                                     vocab_size=vocab_size, curriculum=curriculum)
    return [it.example for it in kept], dropped


def fitting_items(
    stage: str,
    examples: Iterable[Example],
    tok: Tokenizer,
    *,
    max_len: int,
    latents: Latents | None = None,
    mode: str = "cot",
    vocab_size: int | None = None,
    curriculum: Curriculum | None = None,
) -> tuple[list[Item], list[int], int]:
    """`filter_by_length` as (the kept items, their sequence lengths, number dropped): the lengths come with
    the check, which tokenises every example anyway, and size the packed epoch (`data.packing`). With a
    curriculum, an item's length is its longest variant's (so a packed epoch is counted on the long side)."""
    items = make_items(stage, examples, latents, curriculum)
    kept, lengths = [], []
    for it in items:
        variants = [it] if curriculum is None else [it._replace(k=k) for k in curriculum.k_range(len(it.steps))]
        n = 0
        for v in variants:
            seq = build_sequence(stage, tok, v, mode)
            if vocab_size is not None:
                check_token_range(seq.tokens, vocab_size, where=f"{stage} example {it.example.id!r}")
            n = max(n, len(seq))
        if n <= max_len:
            kept.append(it)
            lengths.append(n)
    dropped = len(items) - len(kept)
    msg = "%s: dropped %d of %d examples longer than max_len=%d"
    (log.warning if dropped else log.info)(msg, stage, dropped, len(items), max_len)
    return kept, lengths, dropped


class TokenRangeError(ValueError):
    """A token id does not index the model's embedding table."""


def check_token_range(tokens: np.ndarray, vocab_size: int, *, where: str) -> None:
    tokens = np.asarray(tokens)
    bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
    if bad.size:
        raise TokenRangeError(
            f"{where}: token id {int(bad[0])} is outside the embedding table of {vocab_size} rows "
            f"({bad.size} such ids); the tokenizer and the model disagree on the vocabulary size"
        )
