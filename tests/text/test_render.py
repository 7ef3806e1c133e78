"""dlr_jax.text.render: canvas size rule, determinism, font sampling, overflow reporting, GSM8K-Aug sizes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PIL import ImageOps

from dlr_jax.text import render
from dlr_jax.text.render import (
    RENDER_STATS,
    RenderConfig,
    read_cots,
    render_cot,
    render_cot_ex,
    render_histogram,
    render_to_array,
    sample_font_size,
)

COT = "<<4-2=2>> <<2/.5=4>> <<12/4=3>> <<100*3=300>>"
UNICODE = (
    "3 × 4 ÷ 2 = 6, √16 = 4, π ≈ 3.14, ∑ᵢ xᵢ, 😀🎉, 中文数学题, \\frac{1}{2} + \\sqrt{x^2}\t"
    "tab\there\n\nblank line above\r\nwindows line, control \x00\x07 chars, e\u0301, \U0010ffff"
)


def _random_text(rng: np.random.Generator, n_words: int) -> str:
    words = []
    for _ in range(n_words):
        kind = rng.integers(4)
        if kind == 0:
            a, b = rng.integers(1, 10_000, size=2)
            words.append(f"<<{a}*{b}={a * b}>>")
        elif kind == 1:
            words.append("x" * int(rng.integers(20, 60)))  # longer than a narrow line
        else:
            words.append("".join(rng.choice(list("abcdefgh0123456789+-=."), size=rng.integers(1, 9))))
        if rng.random() < 0.1:
            words.append("\n")
    return " ".join(words)


def test_side_is_multiple_of_64_in_range_and_n_matches():
    rng = np.random.default_rng(0)
    texts = ["", "a", COT, UNICODE, "word " * 3000, "x" * 20_000] + [
        _random_text(rng, int(k)) for k in rng.integers(1, 300, size=12)
    ]
    for t in texts:
        r = render_cot_ex(t, rng=rng)
        assert r.side % 64 == 0 and 64 <= r.side <= 1024
        assert r.image.size == (r.side, r.side) and r.image.mode == "RGB"
        assert r.n_visual_tokens == (r.side // 64) ** 2
        img, n = render_cot(t, font_size=r.font_size)
        assert n == (img.size[0] // 64) ** 2


def test_side_is_the_smallest_that_fits():
    cfg = render.DEFAULT_CONFIG
    rng = np.random.default_rng(1)
    for _ in range(30):
        t = _random_text(rng, int(rng.integers(1, 60)))
        r = render_cot_ex(t, font_size=17)
        assert not r.truncated
        lh = round(17 * cfg.line_spacing)
        assert 2 * cfg.margin + len(r.lines) * lh <= r.side
        if r.side > cfg.min_side:  # one step smaller must not hold the text, re-wrapped to its width
            smaller = r.side - 64
            m = render.font_measure(render.default_font_path(), 17)
            lines = render.wrap(render.split_paragraphs(t), smaller - 2 * cfg.margin, m)
            assert 2 * cfg.margin + len(lines) * lh > smaller


def test_no_text_is_lost_and_ink_stays_inside_margins():
    cfg = render.DEFAULT_CONFIG
    rng = np.random.default_rng(2)
    for t in [COT, _random_text(rng, 80), _random_text(rng, 200)]:
        for size in (15, 17, 20):
            r = render_cot_ex(t, font_size=size)
            assert "".join(r.lines).replace(" ", "") == "".join(t.split())
            ink = ImageOps.invert(r.image.convert("L")).getbbox()
            assert ink is not None
            left, top, right, bottom = ink
            assert left >= cfg.margin - 1 and top >= cfg.margin - 1
            assert right <= r.side - cfg.margin + 1 and bottom <= r.side - cfg.margin + 1


@pytest.mark.parametrize("overflow", ["shrink", "truncate"])
def test_prefix_extension_never_shrinks_the_canvas(overflow):
    # A small max_side keeps the canvases cheap; with "truncate" the walk also goes past it and the
    # side must then stay at max_side (with "shrink" the font changes there, so stop before it).
    cfg = RenderConfig(overflow=overflow, max_side=384)
    rng = np.random.default_rng(3)
    texts = [_random_text(rng, 25) for _ in range(2)]
    if overflow == "truncate":
        texts.append(("<<123*456=56088>> " * 30)[:500])
    for t in texts:
        for size in (15, 20):
            results = [render_cot_ex(t[:i], font_size=size, config=cfg) for i in range(0, len(t) + 1, 2)]
            if overflow == "shrink":
                results = [r for r in results if not r.shrunk]
            sides = [r.side for r in results]
            assert all(a <= b for a, b in zip(sides[:-1], sides[1:], strict=True)), sides
            assert sides[-1] > sides[0]
        if overflow == "truncate" and t.startswith("<<123"):
            assert results[-1].truncated and sides[-1] == cfg.max_side


def test_deterministic_for_a_fixed_seed():
    texts = [COT, UNICODE, _random_text(np.random.default_rng(4), 100)]
    a = [render_to_array(t, rng=np.random.default_rng(7)) for t in texts]
    b = [render_to_array(t, rng=np.random.default_rng(7)) for t in texts]
    for x, y in zip(a, b, strict=True):
        assert x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3 and x.shape[0] == x.shape[1]
        np.testing.assert_array_equal(x, y)
    # rng=None is the documented fixed mean size, so repeated calls agree too
    assert render_cot_ex(COT).font_size == sample_font_size(None) == 18
    np.testing.assert_array_equal(render_to_array(COT), render_to_array(COT))
    # a different seed eventually gives a different size (and so different pixels)
    sizes = {render_cot_ex(COT, rng=np.random.default_rng(s)).font_size for s in range(20)}
    assert len(sizes) > 1


def test_font_size_sampled_within_range():
    rng = np.random.default_rng(5)
    sizes = np.array([sample_font_size(rng) for _ in range(4000)])
    assert sizes.min() == 15 and sizes.max() == 20
    assert set(np.unique(sizes)) == set(range(15, 21))
    assert abs(sizes.mean() - 17.5) < 0.15
    rendered = {render_cot_ex(COT, rng=rng).font_size for _ in range(200)}
    assert rendered <= set(range(15, 21)) and len(rendered) >= 4
    narrow = RenderConfig(font_mean=30.0, font_std=5.0, font_min=8, font_max=12)
    assert {sample_font_size(rng, narrow) for _ in range(100)} <= set(range(8, 13))


def test_unicode_tabs_newlines_do_not_crash_and_newlines_are_kept():
    for size in (6, 15, 20):
        r = render_cot_ex(UNICODE, font_size=size)
        assert not r.truncated
        assert "" in r.lines  # the blank paragraph survives
        arr = np.asarray(r.image)
        assert arr.min() < 128 and arr.max() == 255
    lines = render_cot_ex("a\nb\nc", font_size=17).lines
    assert lines == ("a", "b", "c")


def test_overflow_is_reported():
    RENDER_STATS.reset()
    huge = "word " * 3000
    shrunk = render_cot_ex(huge, font_size=17)
    assert shrunk.shrunk and not shrunk.truncated and shrunk.font_size < 17
    assert shrunk.font_size >= render.DEFAULT_CONFIG.min_font_size
    assert shrunk.side <= 1024

    truncated = render_cot_ex(huge, font_size=17, config=RenderConfig(overflow="truncate"))
    assert truncated.truncated and not truncated.shrunk and truncated.font_size == 17
    assert truncated.side == 1024
    assert len("".join(truncated.lines)) < len(huge.replace(" ", ""))

    hopeless = render_cot_ex("x" * 200_000, font_size=17)  # too long even at the floor size
    assert hopeless.shrunk and hopeless.truncated
    assert hopeless.font_size == render.DEFAULT_CONFIG.min_font_size

    fits = render_cot_ex(COT, font_size=17)
    assert not fits.shrunk and not fits.truncated
    stats = RENDER_STATS.as_dict()
    assert stats["rendered"] == 4 and stats["shrunk"] == 2 and stats["truncated"] == 2
    assert sum(stats["tokens"].values()) == 4


def test_bad_input_errors():
    with pytest.raises(TypeError, match="expects a str"):
        render_cot(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiples of 64"):
        RenderConfig(max_side=1000)
    with pytest.raises(ValueError, match="overflow"):
        dataclasses.replace(render.DEFAULT_CONFIG, overflow="wrap")


def test_read_cots_names_file_and_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("q1||<<1+1=2>> #### 2\nq2||<<2+2=4>> 4\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.txt:2: expected"):
        read_cots(str(p))


def test_gsm8k_aug_valid_cots_give_4_to_16_tokens(data_dir):
    path = data_dir / "gsm8k_aug" / "valid.txt"
    if not path.is_file():
        pytest.skip(f"GSM8K-Aug valid split not found at {path} (set DLR_DATA_DIR)")
    cots = read_cots(str(path))
    assert len(cots) == 500 and cots[0].startswith("<<") and "####" not in cots[0]
    RENDER_STATS.reset()
    hist = render_histogram(cots, rng=np.random.default_rng(0))
    total = sum(hist.values())
    assert total == 500 and RENDER_STATS.rendered == 500 and RENDER_STATS.truncated == 0
    in_range = sum(c for n, c in hist.items() if 4 <= n <= 16)
    print(f"GSM8K-Aug valid, font ~ N(17.5, 1.5) clipped [15, 20], seed 0: n -> count {hist}")
    assert in_range / total >= 0.8, hist
