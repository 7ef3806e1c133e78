"""`data.items`: which examples become which sequences (the length filter; fixtures in conftest.py)."""

import logging

import numpy as np

from dlr_jax.data.items import Item, build_sequence, filter_by_length
from dlr_jax.data.pipeline import make_stage_dataset


def test_length_filter_counts_and_logs(tok, examples, table, caplog):
    lens = [len(build_sequence("sft", tok, Item(ex, tuple(table[ex.id])))) for ex in examples]
    max_len = int(np.median(lens))
    with caplog.at_level(logging.INFO, logger="dlr_jax.data.items"):
        kept, dropped = filter_by_length("sft", examples, tok, max_len=max_len, latents=table)
    assert dropped == sum(n > max_len for n in lens) > 0
    assert [ex.id for ex in kept] == [ex.id for ex, n in zip(examples, lens, strict=True) if n <= max_len]
    assert f"dropped {dropped} of {len(examples)} examples longer than max_len={max_len}" in caplog.text
    batches = list(make_stage_dataset("sft", examples, tok, batch_size=4, max_len=max_len, seed=0, latents=table,
                                      shard_index=0, shard_count=1, num_epochs=1, drop_remainder=False))
    assert sum(int(b["segment_ids"][:, 0].sum()) for b in batches) == len(kept)
