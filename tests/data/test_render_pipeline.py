"""Rendering pipelines: sides planned without drawing, side-bucketed batches, exact resume, workers."""

import numpy as np
import pytest

from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.synthetic import synthetic_splits
from dlr_jax.text import render
from dlr_jax.text.ocr_text import VOCAB, normalize_text

CFG = render.RenderConfig(max_side=192)
B = 4


@pytest.fixture(scope="module")
def texts():
    cots = [ex.cot for ex in synthetic_splits({"train": 40, "valid": 0, "test": 0}, only=["train"])["train"]]
    # a few one-token and overflowing texts too
    return cots + ["1", "2+2", "x" * 600, "<<12*3=36>> " * 12]


def test_canvas_side_matches_the_renderer(texts):
    for overflow in ("shrink", "truncate"):
        cfg = render.RenderConfig(max_side=192, overflow=overflow)
        for i, t in enumerate(texts):
            f = 15 + i % 6
            r = render.render_cot_ex(t, font_size=f, config=cfg)
            assert rp.canvas_side(t, f, cfg) == (r.side, r.shrunk, r.truncated), (t, f, overflow)


def test_font_sizes_follow_the_render_distribution():
    f = rp.sample_font_sizes(4000, 0, CFG)
    assert f.min() >= CFG.font_min and f.max() <= CFG.font_max
    assert abs(f.mean() - CFG.font_mean) < 0.1
    assert np.array_equal(f, rp.sample_font_sizes(4000, 0, CFG))
    assert not np.array_equal(f, rp.sample_font_sizes(4000, 1, CFG))


def test_plan_buckets_and_epochs(texts):
    plan = rp.BatchPlan(texts, batch_size=B, seed=3, config=CFG, max_text_len=64)
    s = plan.stats
    assert sum(s.sides.values()) == len(texts) and s.shrunk >= 1  # the 600-char text is shrunk
    assert s.batches_per_epoch == sum(n // B for n in s.sides.values()) == len(plan)
    assert s.left_out_per_epoch == len(texts) - B * len(plan)
    for e in range(2):
        seen = np.concatenate([idx for _, idx in plan.epoch(e)])
        assert len(seen) == len(set(seen.tolist())) == B * len(plan)  # nobody twice in an epoch
        for side, idx in plan.epoch(e):
            assert np.all(plan.sides[idx] == side)
    assert [i.tolist() for _, i in plan.epoch(0)] != [i.tolist() for _, i in plan.epoch(1)]
    # rebuilding the plan gives the same schedule; another seed another one
    again = rp.BatchPlan(texts, batch_size=B, seed=3, config=CFG, max_text_len=64)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(plan.epoch(1), again.epoch(1), strict=True))
    other = plan.with_seed(4)
    assert np.array_equal(other.fonts, plan.fonts)
    assert [i.tolist() for _, i in other.epoch(0)] != [i.tolist() for _, i in plan.epoch(0)]


def test_batches_render_to_one_side_with_targets(texts):
    plan = rp.BatchPlan(texts, batch_size=B, seed=0, config=CFG, max_text_len=64)
    it = iter(rp.make_render_dataset(plan, num_threads=0))
    for _ in range(len(plan) + 2):  # crosses an epoch boundary
        b = next(it)
        side = b["images"].shape[1]
        assert b["images"].shape == (B, side, side) and b["images"].dtype == np.uint8
        assert side in plan.buckets and b["targets"].shape == (B, plan.target_len[side])
        for row, i in zip(b["targets"], b["index"], strict=True):
            assert plan.sides[i] == side
            ref = normalize_text(texts[i])
            assert VOCAB.decode(row) == ref[: plan.target_len[side] - 1]
        assert (b["images"] < 128).any()  # ink on every canvas


def test_exact_resume_and_process_shards(texts):
    plan = rp.BatchPlan(texts, batch_size=B, seed=1, config=CFG, max_text_len=64)
    it = iter(rp.make_render_dataset(plan, num_threads=1))
    head = [next(it) for _ in range(3)]
    state = it.get_state()
    tail = [next(it) for _ in range(3)]
    again = iter(rp.make_render_dataset(plan, num_threads=1))
    again.set_state(state)
    for a, b in zip(tail, [next(again) for _ in range(3)], strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    # two processes: each takes its half of every global batch, same side
    halves = [iter(rp.make_render_dataset(plan, shard_index=i, shard_count=2, num_threads=0)) for i in range(2)]
    for full in head:
        parts = [next(h) for h in halves]
        assert np.array_equal(np.concatenate([p["index"] for p in parts]), full["index"])
        assert np.array_equal(np.concatenate([p["images"] for p in parts]), full["images"])


def test_worker_processes_match_in_process(texts):
    plan = rp.BatchPlan(texts, batch_size=B, seed=2, config=CFG, max_text_len=64)
    local = iter(rp.make_render_dataset(plan, num_threads=0))
    workers = iter(rp.make_render_dataset(plan, num_workers=1))
    for _ in range(3):
        a, b = next(local), next(workers)
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_fixed_batches_cover_every_example_once(texts):
    batches, fonts = rp.fixed_batches(texts, 3, CFG)
    idx = np.concatenate([i for _, i in batches])
    assert sorted(idx.tolist()) == list(range(len(texts))) and np.all(fonts == render.sample_font_size(None, CFG))
    seen = []
    for b in rp.make_fixed_dataset(texts, batches, fonts, CFG):
        side = b["images"].shape[1]
        for img, i in zip(b["images"], b["index"], strict=True):
            ref = np.asarray(render.render_cot_ex(texts[i], font_size=int(fonts[i]), config=CFG).image)[..., 0]
            assert ref.shape[0] == side and np.array_equal(img, ref)
            seen.append(int(i))
    assert sorted(seen) == list(range(len(texts)))


def test_errors(texts):
    with pytest.raises(ValueError, match="no side bucket holds batch_size"):
        rp.BatchPlan(texts[:3], batch_size=8, seed=0, config=CFG, max_text_len=64)
    plan = rp.BatchPlan(texts, batch_size=B, seed=0, config=CFG, max_text_len=64)
    with pytest.raises(ValueError, match="must divide by the process count"):
        rp.make_render_dataset(plan, shard_count=3)


def test_cot_pieces_are_consecutive_whole_words():
    text = "<<600*30/100=180>> <<600*10/100=60>>  <<180+60=240>>\n<<600-240=360>>"
    pieces = rp.cot_pieces(text, 24)
    assert pieces == ["<<600*30/100=180>>", "<<600*10/100=60>>", "<<180+60=240>>", "<<600-240=360>>"]
    assert rp.cot_pieces(text, 40) == ["<<600*30/100=180>> <<600*10/100=60>>", "<<180+60=240>> <<600-240=360>>"]
    assert " ".join(rp.cot_pieces(text, 7)) == " ".join(text.split())  # nothing lost, words kept whole
    assert rp.cot_pieces("a bc def", 4) == ["a bc", "def"]
    assert rp.cot_pieces("   ", 10) == []
    with pytest.raises(ValueError, match="max_chars"):
        rp.cot_pieces("a", 0)
