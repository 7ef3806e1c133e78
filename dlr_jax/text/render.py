"""CoT text -> square RGB image, and the number of visual tokens it becomes.

The paper renders every chain of thought as black text on a white square whose side L is the
smallest multiple of 64 that holds the word-wrapped text (clipped to [64, 1024]); the vision
encoder turns it into N = (L/64)^2 latent tokens. The font size is drawn per image from a Gaussian
clipped to [15, 20] px so the codebook does not key on one glyph size.

Wrapping depends on the canvas width, so the side is found by trying L = 64, 128, ... and wrapping
at L - 2*margin each time; a prefix extension of a text therefore never gets a smaller canvas at a
fixed font size. Text that does not fit at the largest side is shrunk or truncated, and that is
always reported (`RenderResult.shrunk/truncated` and the module-level `RENDER_STATS`).

Layout notes: the font is DejaVu Sans Mono (shipped with matplotlib) with Pillow's BASIC layout
engine (no raqm), so pixels do not depend on optional system libraries and glyph advances are
whole pixels and additive -- widths are sums of cached per-character advances. Runs of spaces and
tabs collapse to one space (words are re-flowed), explicit newlines are kept, trailing whitespace
is dropped. Characters missing from the font render as the font's box glyph.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import sys
import threading
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

log = logging.getLogger(__name__)

PATCH = 64  # canvas sides are multiples of this; one visual token per PATCH x PATCH cell


@dataclass(frozen=True)
class RenderConfig:
    font_mean: float = 17.5
    font_std: float = 1.5
    font_min: int = 15
    font_max: int = 20
    margin: int = 8  # px of white on every side
    line_spacing: float = 1.2  # line pitch = round(font_size * line_spacing) px
    min_side: int = 64
    max_side: int = 1024
    overflow: Literal["shrink", "truncate"] = "shrink"
    min_font_size: int = 6  # floor for overflow="shrink"; below it the text is truncated
    font_path: str | None = None  # None: matplotlib's DejaVuSansMono.ttf

    def __post_init__(self) -> None:
        if self.min_side % PATCH or self.max_side % PATCH or not 0 < self.min_side <= self.max_side:
            raise ValueError(
                f"RenderConfig: min_side={self.min_side}, max_side={self.max_side} must be positive "
                f"multiples of {PATCH} with min_side <= max_side"
            )
        if not 0 < self.font_min <= self.font_max:
            raise ValueError(
                f"RenderConfig: need 0 < font_min <= font_max, got {self.font_min}, {self.font_max}"
            )
        if self.overflow not in ("shrink", "truncate"):
            raise ValueError(f"RenderConfig.overflow must be 'shrink' or 'truncate', got {self.overflow!r}")
        if 2 * self.margin >= self.min_side or self.margin < 0:
            raise ValueError(f"RenderConfig.margin={self.margin} leaves no room on a {self.min_side}-px side")
        if self.line_spacing <= 0 or self.font_std < 0 or self.min_font_size < 1:
            raise ValueError("RenderConfig: line_spacing > 0, font_std >= 0, min_font_size >= 1 required")


DEFAULT_CONFIG = RenderConfig()


@dataclass(frozen=True)
class RenderResult:
    image: Image.Image
    n_visual_tokens: int  # (side / 64) ** 2
    side: int
    font_size: int  # the size actually drawn (after shrinking)
    lines: tuple[str, ...]  # the wrapped lines drawn
    truncated: bool  # some text was dropped
    shrunk: bool  # drawn smaller than the requested/sampled size


@dataclass
class RenderStats:
    """Process-wide counters so a pipeline can report overflows instead of hiding them."""

    rendered: int = 0
    shrunk: int = 0
    truncated: int = 0
    tokens: Counter = field(default_factory=Counter)  # n_visual_tokens -> count
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, r: RenderResult) -> None:
        with self._lock:
            self.rendered += 1
            self.shrunk += r.shrunk
            self.truncated += r.truncated
            self.tokens[r.n_visual_tokens] += 1

    def reset(self) -> None:
        with self._lock:
            self.rendered = self.shrunk = self.truncated = 0
            self.tokens = Counter()

    def as_dict(self) -> dict[str, object]:
        with self._lock:
            return {
                "rendered": self.rendered,
                "shrunk": self.shrunk,
                "truncated": self.truncated,
                "tokens": dict(sorted(self.tokens.items())),
            }


RENDER_STATS = RenderStats()


def default_font_path() -> str:
    import matplotlib

    return os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSansMono.ttf")


@functools.lru_cache(maxsize=64)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size, layout_engine=ImageFont.Layout.BASIC)


class _Measure:
    """Per-(font, size) advance widths, one `getlength` per distinct character ever seen."""

    def __init__(self, font: ImageFont.FreeTypeFont):
        self.font = font
        self.char_w: dict[str, float] = {}

    def char(self, c: str) -> float:
        w = self.char_w.get(c)
        if w is None:
            w = self.char_w[c] = self.font.getlength(c)
        return w

    def word(self, s: str) -> float:
        cw = self.char_w
        try:
            return sum(cw[c] for c in s)
        except KeyError:
            return sum(self.char(c) for c in s)


@functools.lru_cache(maxsize=64)
def font_measure(path: str, size: int) -> _Measure:
    return _Measure(_font(path, size))


def split_paragraphs(text: str) -> list[list[str]]:
    text = text.replace("\r\n", "\n").replace("\r", "\n").rstrip()
    # Other control characters would draw as boxes at best; a space keeps word boundaries.
    if any(ord(c) < 32 and c != "\n" for c in text):
        text = "".join(" " if ord(c) < 32 and c != "\n" else c for c in text)
    return [p.split() for p in text.split("\n")] if text else []


def wrap(paragraphs: list[list[str]], width: float, m: _Measure) -> list[str]:
    """Greedy word wrap at `width` px; a word longer than a line is split across lines,
    starting in the space left on the current line (as `textwrap` does)."""
    space = m.char(" ")
    lines: list[str] = []
    for words in paragraphs:
        cur: list[str] = []
        cur_w = 0.0
        for word in words:
            ww = m.word(word)
            need = ww + (space if cur else 0.0)
            if cur_w + need <= width:
                cur.append(word)
                cur_w += need
                continue
            if ww <= width:
                lines.append(" ".join(cur))
                cur, cur_w = [word], ww
                continue
            # Too long for any line: fill what is left of this line, then whole lines.
            if cur:
                cur_w += space
            cum = list(accumulate(m.char(c) for c in word))  # cum[i] = width of word[: i + 1]
            start, done = 0, 0.0  # done = cum[start - 1]
            while start < len(word):
                end = bisect_right(cum, done + width - cur_w, lo=start)
                if end == start and not cur:  # a single glyph wider than the line: place it anyway
                    end = start + 1
                if end > start:
                    cur.append(word[start:end])
                    cur_w += cum[end - 1] - done
                    start, done = end, cum[end - 1]
                if start < len(word):
                    lines.append(" ".join(cur))
                    cur, cur_w = [], 0.0
        lines.append(" ".join(cur))
    return lines


def _line_height(size: int, cfg: RenderConfig) -> int:
    return max(1, round(size * cfg.line_spacing))


def _fits(n_lines: int, side: int, size: int, cfg: RenderConfig) -> bool:
    return 2 * cfg.margin + n_lines * _line_height(size, cfg) <= side


def fit_layout(
    paragraphs: list[list[str]], size: int, cfg: RenderConfig, path: str
) -> tuple[int, list[str]] | None:
    """Smallest side (multiple of 64 in [min_side, max_side]) that holds the text, or None."""
    m = font_measure(path, size)
    # A line holds at most `width` px of glyphs, which bounds the line count from below; sides
    # that fail the bound cannot fit, so they are skipped without wrapping (same result, faster).
    glyphs = [sum(m.word(w) for w in words) for words in paragraphs]
    for side in range(cfg.min_side, cfg.max_side + 1, PATCH):
        width = side - 2 * cfg.margin
        if not _fits(sum(max(1, math.ceil(g / width)) for g in glyphs), side, size, cfg):
            continue
        lines = wrap(paragraphs, width, m)
        if _fits(len(lines), side, size, cfg):
            return side, lines
    return None


def sample_font_size(
    rng: np.random.Generator | int | None = None, config: RenderConfig = DEFAULT_CONFIG
) -> int:
    """Gaussian(font_mean, font_std) clipped to [font_min, font_max], rounded to whole px.

    `rng=None` returns the (clipped, rounded) mean -- deterministic, 18 px by default; an int is
    used as a seed for `np.random.default_rng`.
    """
    if rng is None:
        x = config.font_mean
    else:
        if not isinstance(rng, np.random.Generator):
            rng = np.random.default_rng(rng)
        x = rng.normal(config.font_mean, config.font_std)
    return int(np.rint(np.clip(x, config.font_min, config.font_max)))


def render_cot_ex(
    text: str,
    *,
    rng: np.random.Generator | int | None = None,
    font_size: int | None = None,
    config: RenderConfig = DEFAULT_CONFIG,
) -> RenderResult:
    """Renders `text` and returns the image with its layout facts; see `render_cot`."""
    if not isinstance(text, str):
        raise TypeError(f"render_cot expects a str, got {type(text).__name__}")
    requested = sample_font_size(rng, config) if font_size is None else int(font_size)
    if requested < 1:
        raise ValueError(f"font_size must be >= 1 px, got {font_size}")
    path = config.font_path or default_font_path()
    paragraphs = split_paragraphs(text)

    size, truncated = requested, False
    found = fit_layout(paragraphs, size, config, path)
    if found is None and config.overflow == "shrink":
        # Check the largest canvas first so each smaller size costs one wrap until one fits.
        while found is None and size > config.min_font_size:
            size -= 1
            lines = wrap(paragraphs, config.max_side - 2 * config.margin, font_measure(path, size))
            if _fits(len(lines), config.max_side, size, config):
                found = fit_layout(paragraphs, size, config, path)
    if found is None:
        side = config.max_side
        lines = wrap(paragraphs, side - 2 * config.margin, font_measure(path, size))
        keep = max(0, (side - 2 * config.margin) // _line_height(size, config))
        lines, truncated = lines[:keep], True
        log.warning("render: CoT of %d chars truncated to %d lines at %d px", len(text), keep, size)
        found = (side, lines)
    side, lines = found

    # Grey-scale drawing then one conversion: same pixels as drawing in RGB, one channel drawn instead of three.
    img = Image.new("L", (side, side), 255)
    draw = ImageDraw.Draw(img)
    font = _font(path, size)
    lh = _line_height(size, config)
    y = config.margin
    for line in lines:
        if line:
            draw.text((config.margin, y), line, fill=0, font=font)
        y += lh
    result = RenderResult(
        image=img.convert("RGB"),
        n_visual_tokens=(side // PATCH) ** 2,
        side=side,
        font_size=size,
        lines=tuple(lines),
        truncated=truncated,
        shrunk=size < requested,
    )
    RENDER_STATS.record(result)
    return result


def render_cot(
    text: str,
    *,
    rng: np.random.Generator | int | None = None,
    font_size: int | None = None,
    config: RenderConfig = DEFAULT_CONFIG,
) -> tuple[Image.Image, int]:
    """CoT text -> (RGB image of side L, n_visual_tokens = (L/64)^2).

    Font size: `font_size` if given, else drawn from `rng` (a `numpy.random.Generator`; see
    `sample_font_size` -- `None` means the fixed mean size, so the call is deterministic).
    Overflow beyond `config.max_side` is shrunk/truncated per `config.overflow` and counted in
    `RENDER_STATS`; use `render_cot_ex` to see it per image.
    """
    r = render_cot_ex(text, rng=rng, font_size=font_size, config=config)
    return r.image, r.n_visual_tokens


def render_to_array(text: str, **kwargs) -> np.ndarray:
    """`render_cot` as a uint8 array [L, L, 3]."""
    return np.asarray(render_cot(text, **kwargs)[0], dtype=np.uint8)


def render_histogram(
    texts: Iterable[str],
    *,
    rng: np.random.Generator | int | None = None,
    font_size: int | None = None,
    config: RenderConfig = DEFAULT_CONFIG,
) -> dict[int, int]:
    """n_visual_tokens -> count over `texts` (an int `rng` seeds one generator for all texts)."""
    if rng is not None and not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    hist: Counter = Counter()
    for t in texts:
        hist[render_cot_ex(t, rng=rng, font_size=font_size, config=config).n_visual_tokens] += 1
    return dict(sorted(hist.items()))


def read_cots(path: str) -> list[str]:
    """CoTs from a GSM8K-Aug style file (`question||cot #### answer`), or one text per line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if "||" in line:
                rest = line.split("||", 1)[1]
                if " #### " not in rest:
                    raise ValueError(f"{path}:{lineno}: expected 'question||cot #### answer', no ' #### '")
                line = rest.rsplit(" #### ", 1)[0]
            out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlr_jax.text.render", description=__doc__.split("\n")[0])
    p.add_argument("text", nargs="?", help="text to render (with --out)")
    p.add_argument("--out", help="write the rendered image here (PNG)")
    p.add_argument("--file", help="GSM8K-Aug file or one text per line: print the token histogram")
    p.add_argument("--seed", type=int, default=0, help="font-size RNG seed (-1: fixed mean size)")
    p.add_argument("--font-size", type=int, default=None)
    p.add_argument("--overflow", choices=("shrink", "truncate"), default="shrink")
    p.add_argument("--throughput", action="store_true", help="also time rendering (images/s, this core)")
    a = p.parse_args(argv)
    cfg = RenderConfig(overflow=a.overflow)
    rng = None if a.seed < 0 else np.random.default_rng(a.seed)
    if a.text is not None:
        r = render_cot_ex(a.text, rng=rng, font_size=a.font_size, config=cfg)
        print(
            f"side={r.side} n={r.n_visual_tokens} font={r.font_size} "
            f"truncated={r.truncated} shrunk={r.shrunk}"
        )
        if a.out:
            r.image.save(a.out)
    if a.file:
        texts = read_cots(a.file)
        RENDER_STATS.reset()
        t0 = time.perf_counter()
        hist = render_histogram(texts, rng=rng, font_size=a.font_size, config=cfg)
        dt = time.perf_counter() - t0
        total = sum(hist.values())
        mean = sum(n * c for n, c in hist.items()) / max(total, 1)
        print(f"{a.file}: {total} texts, mean n = {mean:.2f}")
        for n, c in hist.items():
            print(f"  n={n:4d} side={int(math.sqrt(n)) * PATCH:5d}: {c:6d} ({100 * c / total:5.1f} %)")
        s = RENDER_STATS.as_dict()
        print(f"  shrunk={s['shrunk']} truncated={s['truncated']}")
        if a.throughput:
            print(f"  {total / dt:.0f} images/s (one process, incl. first-use font loading)")
    if a.text is None and not a.file:
        p.print_usage()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
