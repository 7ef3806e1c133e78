"""Changes to how the codebook stage renders CoTs, as --set values: half the font size (the `half_font`
ablation, and the encoder table's second setting) and a larger canvas (a lever: more visual tokens N)."""

from __future__ import annotations

from dlr_jax.config import Config


def half_font_overrides(cfg: Config) -> tuple[str, ...]:
    """Glyphs at half the size: the same text fills a quarter of the area, so the canvas (and N =
    (side/64)^2) shrinks. With a fixed canvas (min_side == max_side, as configs/tiny.yaml) the side is
    halved too, else the text would just sit in a corner of the same N-token image."""
    c = cfg.codebook
    out = [f"codebook.font_mean={c.font_mean / 2:g}", f"codebook.font_std={c.font_std / 2:g}",
           f"codebook.font_min={max(1, round(c.font_min / 2))}", f"codebook.font_max={max(1, round(c.font_max / 2))}"]
    if c.min_side == c.max_side:
        side = max(64, c.max_side // 2)
        out += [f"codebook.min_side={side}", f"codebook.max_side={side}"]
    return tuple(out)


def larger_canvas_overrides(cfg: Config) -> tuple[str, ...]:
    """More visual tokens per CoT: a fixed canvas (min_side == max_side) grows by 64 px (128 -> 192: N = 4 -> 9,
    fonts unchanged, so glyphs that were shrunk to fit get their size back); a canvas sized to the text gets
    glyphs 1.5x larger (the text covers 2.25x the area, so N grows about as much)."""
    c = cfg.codebook
    if c.min_side == c.max_side:
        side = c.max_side + 64
        return f"codebook.min_side={side}", f"codebook.max_side={side}"
    return (f"codebook.font_mean={c.font_mean * 1.5:g}", f"codebook.font_std={c.font_std * 1.5:g}",
            f"codebook.font_min={round(c.font_min * 1.5)}", f"codebook.font_max={round(c.font_max * 1.5)}")
