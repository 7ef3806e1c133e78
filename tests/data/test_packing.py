"""`data.packing` replays grain's first-fit packer: the rows it counts are the rows the packed pipeline makes."""

from pathlib import Path

import grain
import numpy as np
import pytest

from dlr_jax.data.items import fitting_items
from dlr_jax.data.latents import random_latents
from dlr_jax.data.packing import PackStats, first_fit_rows, pack_stats, rows_for_examples
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


# ----------------------------------------------------------------------------------------------
# data.pack_batch=examples: a packed step of about batch_size examples, in fewer rows.


def test_rows_for_examples_settles_on_a_multiple():
    lengths = np.random.default_rng(1).integers(20, 100, 3000)  # about 4 a row of 256
    rows, stats = rows_for_examples(lengths, 256, 64, seed=2)
    assert stats == pack_stats(lengths, 256, rows, 2)  # the stats of the bins the pipeline will open
    assert abs(rows * stats.examples_per_row - 64) <= stats.examples_per_row / 2  # the nearest row count
    assert rows == rows_for_examples(lengths, 256, 64, seed=2, multiple=1)[0] < 64 // 3
    for m in (4, 8):
        r, s = rows_for_examples(lengths, 256, 64, seed=2, multiple=m)
        assert r % m == 0 and abs(r * s.examples_per_row - 64) <= m * s.examples_per_row / 2
    assert rows_for_examples(lengths, 256, 2, seed=2, multiple=8)[0] == 8  # never fewer than one multiple
    assert rows_for_examples([300] * 5 + [200] * 50, 256, 16)[0] == 16  # one a row: as many rows as examples


@pytest.fixture(scope="module")
def many(setup):
    """More examples than `setup`'s, so an epoch is ~15 steps of 64 and the per-step means are not one step's."""
    _, tok, _ = setup
    examples = generate(960, seed=5)
    return examples, tok, random_latents(examples, 32, seed=0)


def _examples_per_step(ds):
    """Examples (segments) of each batch of one epoch."""
    return [int(b["segment_ids"].max(axis=1).sum()) for b in ds]


@pytest.mark.parametrize("stage", ["textsft", "align", "sft"])
def test_pack_batch_examples_holds_a_padded_batch_in_fewer_rows(stage, many):
    examples, tok, table = many
    # align's rows hold ~13 examples: a step of 64 examples is 5 rows (64 / 13 rounds to whole rows: 65 examples)
    batch, max_len, seed = 64, 352, 3
    kw = dict(batch_size=batch, max_len=max_len, seed=seed, latents=table, num_epochs=1, drop_remainder=False,
              shard_index=0, shard_count=1, num_threads=0)
    ds = make_stage_dataset(stage, examples, tok, pack=True, pack_batch="examples", **kw)
    _, lengths, _ = fitting_items(stage, examples, tok, max_len=max_len, latents=table)
    assert max(lengths) <= max_len // 2  # every example under half a row: a row holds two or more
    per_step = _examples_per_step(ds)
    rows = [b["tokens"].shape[0] for b in ds]
    # (b) fewer rows a step than examples, every full step the same
    assert ds.global_batch < batch and set(rows[:-1]) == {ds.global_batch}
    # (a) a step holds about batch_size examples, and an epoch is about as many steps as padded
    assert abs(np.mean(per_step[:-1]) - batch) <= 0.1 * batch, per_step
    assert abs(ds.examples_per_step - batch) <= 0.1 * batch
    padded = make_stage_dataset(stage, examples, tok, **kw)
    padded_steps = sum(1 for _ in padded)
    assert abs(len(per_step) - padded_steps) <= 0.1 * padded_steps, (len(per_step), padded_steps)
    assert ds.pack.steps(1, ds.global_batch, packed=True) == pytest.approx(padded_steps, rel=0.1)
    # what data.pack_batch=rows does with the same batch_size: a step of batch_size rows, several times the examples
    by_rows = make_stage_dataset(stage, examples, tok, pack=True, **kw)
    assert np.mean(_examples_per_step(by_rows)[:-1]) > 1.5 * batch


def test_pack_batch_examples_needs_packing(setup):
    from dlr_jax.config import ConfigError, load_config
    from dlr_jax.config.root import DataConfig
    from dlr_jax.stages.common import data_kwargs, make_mesh_for

    examples, tok, table = setup
    # read only when packed: `--set data.pack=false` on a config that packs (the paper's) trains padded rows
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs" / "qwen3-4b.yaml", ["data.pack=false", "mesh.fsdp=1"])
    assert cfg.data.pack_batch == "exact" and not cfg.data.pack
    assert data_kwargs(cfg, cfg.train.sft, make_mesh_for(cfg), 100)["pack_batch"] == "rows"
    # exact rows are sized on the batches the run reads: its schedule (3 epochs of 100 at 64: 5), or --steps past it
    packed = load_config(root / "configs" / "qwen3-4b.yaml", ["mesh.fsdp=1"])
    assert data_kwargs(packed, packed.train.sft, make_mesh_for(packed), 100)["horizon_steps"] == 5
    assert data_kwargs(packed, packed.train.sft, make_mesh_for(packed), 100, stop=40)["horizon_steps"] == 40
    with pytest.raises(ConfigError, match="data.pack_batch must be rows|examples"):
        DataConfig(pack=True, pack_batch="tokens")
    assert DataConfig().pack_batch == "rows" and DataConfig(pack=True, pack_batch="examples").pack
    with pytest.raises(ValueError, match="needs pack=True"):
        make_stage_dataset("sft", examples, tok, batch_size=4, max_len=160, seed=0, latents=table,
                           pack_batch="examples", shard_index=0, shard_count=1)


def test_pack_batch_examples_says_when_whole_multiples_of_rows_miss_the_batch(many, caplog):
    """Rows come in multiples of grad_accum x the data-parallel devices: where one multiple already holds far more
    than batch_size examples, the step cannot hold batch_size, and the pipeline says so with a batch size that fits."""
    examples, tok, table = many
    kw = dict(batch_size=64, max_len=352, seed=3, latents=table, num_epochs=1, shard_index=0, shard_count=1,
              num_threads=0, pack=True, pack_batch="examples")
    with caplog.at_level("WARNING", logger="dlr_jax.data.pipeline"):
        make_stage_dataset("align", examples, tok, row_multiple=1, **kw)
        assert not [r for r in caplog.records if "pack_batch=examples" in r.getMessage()]
        ds = make_stage_dataset("align", examples, tok, row_multiple=8, **kw)  # 8 rows of ~13: ~100 examples
    said = [r.getMessage() for r in caplog.records if "pack_batch=examples" in r.getMessage()]
    assert ds.global_batch == 8 and len(said) == 1 and "not batch_size 64" in said[0] and "multiples of 8" in said[0]
