"""Evaluation prompts in batches grouped by length, so each batch pads only to its own longest prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from dlr_jax.data import formats
from dlr_jax.data.records import Example
from dlr_jax.text.tokens import Tokenizer


class EvalBatch(NamedTuple):
    """indices: positions in the input list; prompts: formats.prompt_ids for each, unpadded."""

    indices: list[int]
    prompts: list[list[int]]

    @property
    def max_len(self) -> int:
        return max(len(p) for p in self.prompts)


def make_eval_batches(examples: Sequence[Example], tok: Tokenizer, batch_size: int) -> list[EvalBatch]:
    """Prompts grouped by length (longest first, ties by index), `batch_size` per batch (the last
    may be smaller), so each batch pads only to its own longest prompt. Every index appears once."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    prompts = [formats.prompt_ids(tok, ex.question) for ex in examples]
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    return [
        EvalBatch(order[s : s + batch_size], [prompts[i] for i in order[s : s + batch_size]])
        for s in range(0, len(order), batch_size)
    ]
