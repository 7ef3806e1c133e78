"""The rendered-CoT corpus (TFDS array_record, read by grain): pixel-identical to rendering on the fly, in
the plan's order; two shards cover every example once; unfinished, resumed and mismatched caches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from dlr_jax.config import load_config
from dlr_jax.data import render_corpus as rc
from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.sources import corpus_texts
from dlr_jax.stages.codebook.stage import open_render_cache

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")
# 50 synthetic CoTs on canvases of 64..256 px, so the plan has several side buckets to interleave.
SETS = ["data.synthetic_train=50", "data.synthetic_eval=8", "codebook.min_side=64", "codebook.max_side=256",
        "codebook.train.batch_size=4"]


def _argv(out: Path, *extra: str) -> list[str]:
    return ["--config", TINY, *(a for s in SETS for a in ("--set", s)), "--split", "train", "--out", str(out),
            "--num-shards", "2", "--workers", "0", "--no-progress", *extra]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The CLI run once per shard, as two processes (or hosts) would render into one directory."""
    out = tmp_path_factory.mktemp("render_cache")
    for i in (0, 1):
        rc.main(_argv(out, "--shard", str(i)))
    cfg = load_config(TINY, [*SETS, f"codebook.render_cache={out}"])
    return out, cfg, corpus_texts(cfg)


def test_help_explains_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        rc.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--split" in text and "--num-shards" in text and "codebook.render_cache" in text and "Resuming" in text


def test_cache_is_pixel_identical_to_rendering_in_the_plan_order(rendered):
    out, cfg, texts = rendered
    assert len(texts) == 50
    rcfg = rp.render_config(cfg.codebook)
    cache = open_render_cache(cfg, texts)
    assert isinstance(cache, rc.RenderCache) and len(cache) == 50
    kw = dict(batch_size=4, seed=cfg.run.seed, config=rcfg, max_text_len=cfg.codebook.max_text_len)
    live, cached = rp.BatchPlan(texts, **kw), rp.BatchPlan(texts, **kw, cache=cache)
    assert len(live.buckets) > 1  # several sides interleave in the epoch
    for epoch_seed in (0, 7):  # another epoch order reads other records, the same pixels
        a = list(rp.make_render_dataset(live.with_seed(epoch_seed), num_epochs=1))
        b = list(rp.make_render_dataset(cached.with_seed(epoch_seed), num_epochs=1))
        assert len(a) == len(b) == len(live)
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
    # the sweep in id order: each record is its example, drawn at the plan's font size
    for i, ex in enumerate(cache.dataset()):
        assert ex["id"] == i and ex["text"] == texts[i] and ex["font_size"] == live.fonts[i]
        side = int(live.sides[i])
        np.testing.assert_array_equal(ex["image"], rp.render_images([texts[i]], [live.fonts[i]], side, rcfg)[0])


def test_cache_reads_in_grain_worker_processes(rendered):
    """The cache pickles into grain's worker processes (each reopens the TFDS sources)."""
    out, cfg, texts = rendered
    kw = dict(batch_size=4, seed=cfg.run.seed, config=rp.render_config(cfg.codebook),
              max_text_len=cfg.codebook.max_text_len)
    cached = rp.BatchPlan(texts, **kw, cache=open_render_cache(cfg, texts))
    it = iter(rp.make_render_dataset(cached, num_epochs=1, num_workers=1))
    try:
        got = [next(it) for _ in range(2)]
    finally:
        it.close()
    for i, b in enumerate(got):
        want = rp.render_train_batch(i, None, plan=rp.BatchPlan(texts, **kw), rows=slice(None))
        for k in want:
            np.testing.assert_array_equal(b[k], want[k], err_msg=k)


def test_each_shard_is_a_plain_tfds_dataset(rendered):
    """Any TFDS reader opens a shard from its files alone (no dlr_jax builder class registered), with the
    render settings in its metadata and the PNG decoding to the canvas side recorded beside it."""
    out, cfg, texts = rendered
    sdir = out / "shards" / rc.shard_name("train", 1, 2)
    src = tfds.data_source(rc.BUILDER, data_dir=str(sdir), split="train", download=False)
    assert len(src) == 25
    rec = src[0]
    assert set(rec) == {"png", "text", "side", "font_size", "drawn_font_size", "id"} and rec["id"] == 25
    assert rec["text"].decode() == texts[25] and rc.decode_png(rec["png"]).shape == (rec["side"], rec["side"])
    info = tfds.builder(rc.BUILDER, data_dir=str(sdir)).info
    assert info.metadata["settings"]["seed"] == cfg.run.seed and info.metadata["examples"] == 50


def test_two_shards_cover_every_example_once(rendered):
    out, cfg, texts = rendered
    ids = [np.load(out / "shards" / rc.shard_name("train", i, 2) / "ids.npy") for i in (0, 1)]
    assert [len(x) for x in ids] == [25, 25]
    assert sorted(np.concatenate(ids).tolist()) == list(range(50))
    cache = rc.RenderCache(out)
    read = [[ex["id"] for ex in cache.dataset(i, 2)] for i in (0, 1)]  # two readers (processes)
    assert not set(read[0]) & set(read[1]) and sorted(read[0] + read[1]) == list(range(50))


def test_unfinished_cache_is_refused_and_a_rerun_renders_only_what_is_missing(tmp_path, monkeypatch):
    texts = [f"Tom has {i} apples. He buys {i + 2} more, so {2 * i + 2}." for i in range(9)]
    cfg = rp.render.RenderConfig(min_side=64, max_side=128)
    drawn = []
    real = rc.render_example
    monkeypatch.setattr(rc, "render_example", lambda i, **kw: drawn.append(i) or real(i, **kw))
    rc.write_corpus(texts, cfg, 3, tmp_path, num_shards=3, shards=[1], progress=False)
    assert drawn == [3, 4, 5]
    with pytest.raises(rc.RenderCacheError, match=r"unfinished: shards \[0, 2\] of 3"):
        rc.RenderCache(tmp_path)
    drawn.clear()
    rc.write_corpus(texts, cfg, 3, tmp_path, num_shards=3, progress=False)
    assert drawn == [0, 1, 2, 6, 7, 8]  # shard 1 was done: skipped
    drawn.clear()
    rc.write_corpus(texts, cfg, 3, tmp_path, num_shards=3, progress=False)
    assert drawn == []
    rc.RenderCache(tmp_path).check(texts, cfg, 3)
    with pytest.raises(rc.RenderCacheError, match=r"another rendering .*settings.seed: 3 vs 4"):
        rc.write_corpus(texts, cfg, 4, tmp_path, num_shards=3, progress=False)


@pytest.mark.parametrize(("override", "message"), [
    ("codebook.font_mean=18.0", r"settings\.font_mean: 17\.5 vs 18\.0"),
    ("codebook.max_side=512", r"settings\.max_side: 256 vs 512"),
    ("run.seed=1", r"settings\.seed: 0 vs 1"),
    ("data.synthetic_train=49", r"examples: 50 vs 49"),
])
def test_a_cache_rendered_otherwise_is_a_clear_error(rendered, override, message):
    out, _, _ = rendered
    cfg = load_config(TINY, [*SETS, f"codebook.render_cache={out}", override])
    with pytest.raises(rc.RenderCacheError, match=message) as e:
        open_render_cache(cfg, corpus_texts(cfg))
    assert "codebook.render_cache=''" in str(e.value)


def test_no_cache_renders_on_the_fly_and_a_missing_one_names_the_command(tmp_path):
    cfg = load_config(TINY, SETS)
    assert open_render_cache(cfg, ["x"]) is None
    cfg = load_config(TINY, [*SETS, f"codebook.render_cache={tmp_path / 'none'}"])
    with pytest.raises(rc.RenderCacheError, match="python -m dlr_jax.data.render_corpus"):
        open_render_cache(cfg, ["x"])


def test_the_codebook_stage_builds_its_plan_on_the_cache(rendered, tmp_path, monkeypatch):
    """`codebook.run` with codebook.render_cache: its training batches come from the cache (stopped at
    the first batch stream, before anything is compiled for training)."""
    from dlr_jax.stages.codebook import stage as codebook
    from tests.micro import codebook_nets

    out, _, texts = rendered
    plans = []

    class Stop(Exception):
        pass

    def first_stream(plan, **kw):
        plans.append(plan)
        raise Stop

    monkeypatch.setattr(codebook.rp, "make_render_dataset", first_stream)
    cfg = load_config(TINY, [*SETS, *codebook_nets(num_queries=16), f"codebook.render_cache={out}", "mesh.fsdp=1",
                             "codebook.warmup_steps=0", "codebook.kmeans_init_batches=0"])
    with pytest.raises(Stop):
        codebook.run(cfg, tmp_path)
    (plan,) = plans
    assert isinstance(plan.cache, rc.RenderCache) and plan.cache.path == out and plan.texts == texts
    with pytest.raises(rc.RenderCacheError, match="font_std"):  # checked before the stage builds anything
        codebook.run(load_config(TINY, [*SETS, f"codebook.render_cache={out}", "codebook.font_std=2.0"]), tmp_path)
