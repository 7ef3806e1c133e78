"""`data.packing` replays grain's first-fit packer: the rows it counts are the rows the packed pipeline makes."""

import grain
import numpy as np
import pytest

from dlr_jax.data.items import fitting_items
from dlr_jax.data.latents import random_latents
from dlr_jax.data.packing import PackStats, first_fit_rows, pack_stats
from dlr_jax.data.pipeline import make_stage_dataset
from dlr_jax.data.synthetic import generate
from dlr_jax.text.tokens import Tokenizer, train_bpe


def test_first_fit_rows_by_hand():
    # bins of 10, 2 open at once: [6, 3] [5] fill two rows; 7 fits neither -> both go out; [7] [9]; 8 fits neither
    assert first_fit_rows([6, 5, 3, 7, 9, 8], 10, 2) == 5
    assert first_fit_rows([], 10, 2) == 0
    assert first_fit_rows([10, 10, 10], 10, 1) == 3
    with pytest.raises(ValueError, match="cannot be packed"):
        first_fit_rows([11], 10, 4)


def test_stats_and_steps():
    s = PackStats(examples=300, tokens=24_000, max_len=256, rows=100)
    assert s.examples_per_row == 3 and s.packed_efficiency == pytest.approx(24_000 / 25_600)
    assert s.padded_efficiency == pytest.approx(24_000 / 76_800)
    assert s.steps(3, 64, packed=False) == 15 and s.steps(3, 64, packed=True) == 5
    assert s.steps(1, 10, packed=True, examples=3000) == 100  # measured on a sample of a larger epoch
    # more open bins pack at least as tightly
    lengths = np.random.default_rng(0).integers(20, 140, 2000)
    assert pack_stats(lengths, 256, 64).rows <= pack_stats(lengths, 256, 1).rows
    assert pack_stats([*lengths, 300], 256, 8).examples == 2000  # longer than a row: dropped, as the pipeline does


@pytest.fixture(scope="module")
def setup():
    examples = generate(120, seed=0)
    base = train_bpe([f"{e.question}\n{e.cot}{e.answer}" for e in examples], vocab_size=300, num_latents=32)
    tok = Tokenizer(base.backend, pad_token="<|pad|>", num_latents=32)
    return examples, tok, random_latents(examples, 32, seed=0)


@pytest.mark.parametrize("stage", ["textsft", "align", "sft"])
def test_replays_the_pipelines_packer(stage, setup):
    examples, tok, table = setup
    max_len, batch, seed = 160, 4, 3
    ds = make_stage_dataset(stage, examples, tok, batch_size=batch, max_len=max_len, seed=seed, latents=table,
                            pack=True, num_epochs=1, drop_remainder=False, shard_index=0, shard_count=1)
    rows = sum(b["tokens"].shape[0] for b in ds)
    items, lengths, _ = fitting_items(stage, examples, tok, max_len=max_len, latents=table)
    order = grain.MapDataset.range(len(items)).shuffle(seed=seed)  # the pipeline's epoch order
    assert first_fit_rows([lengths[order[i]] for i in range(len(items))], max_len, batch) == rows
    # the stage's estimate (another shuffle of the same lengths) is close, and says one epoch's examples
    assert ds.pack.examples == len(items) and ds.pack.tokens == sum(lengths)
    assert abs(ds.pack.rows - rows) <= max(2, rows // 10)
    assert ds.examples_per_step == pytest.approx(batch * ds.pack.examples_per_row)
    padded = make_stage_dataset(stage, examples, tok, batch_size=batch, max_len=max_len, seed=seed, latents=table,
                                shard_index=0, shard_count=1)
    assert padded.examples_per_step == batch and padded.pack.rows == len(items)
