"""A chain of thought cut into its reasoning steps (`split_steps`), one splitter per data source's chain style.

The codebook can render each step on its own canvas (`codebook.render_unit=step`) so that an example's
latent span is its steps' codes in order and a code never mixes two steps; the latent curriculum and the
per-step targets read the same cut. Styles (`STEP_STYLES`):

- `equations`: calculator chains, `<<3+4=7>> <<7*2=14>>` (GSM8K-Aug, the synthetic task's default
  `cot_style`): one step per `<<...>>` annotation;
- `natural`: sentences (GSM8K's worked solutions, with or without their inline annotations; the synthetic
  task's `cot_style="natural"`): one step per sentence or line;
- `math`: MATH solutions (LaTeX): one step per sentence or line (an equation line of an `align`), where a
  full stop inside `$...$`, `\\[...\\]` or `\\(...\\)` ends no sentence and an `[asy]` figure stays whole;
- `auto`: `equations` when the CoT is annotations only, else `math` when it holds a LaTeX command, else
  `natural` (GSM8K's `$` is money, so a dollar sign alone does not make a CoT LaTeX).

A step boundary is always a run of whitespace: `" ".join(steps)` is the CoT with its whitespace collapsed
(`" ".join(cot.split())`) once each step's own whitespace is collapsed too. Steps keep their inner
whitespace (a MATH step's line breaks), no step is empty, and a CoT with no split point is one step.
"""

from __future__ import annotations

import re

__all__ = ["AUTO", "EQUATIONS", "MATH", "NATURAL", "STEP_STYLES", "split_steps", "step_style"]

AUTO, EQUATIONS, NATURAL, MATH = "auto", "equations", "natural", "math"
STEP_STYLES = (AUTO, EQUATIONS, NATURAL, MATH)

_ANNOTATION = re.compile(r"<<.*?>>", flags=re.S)
_LATEX = re.compile(r"\\[A-Za-z]+|\\[\[(]|\$\$")
_WORD = re.compile(r"\S+")
# a sentence ends in . ! or ?, possibly followed by closing quotes, brackets or the end of a formula
_SENTENCE_END = re.compile(r"[.!?](?:[)\"'\u2019\u201d\]$]|\\[\])])*$")
# math delimiters, longest first ("$$" before "$"); an escaped dollar `\$` is text
_MATH_OPEN = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_ASY = ("[asy]", "[/asy]")


def step_style(cot: str) -> str:
    """The style `auto` picks for `cot` (one of EQUATIONS, NATURAL, MATH)."""
    if _ANNOTATION.search(cot) and not _ANNOTATION.sub("", cot).strip():
        return EQUATIONS
    return MATH if _LATEX.search(cot) else NATURAL


def _mask(cot: str, math: bool) -> tuple[list[bool], list[bool]]:
    """Per character: inside a region no step boundary may cut (a `<<...>>` annotation, an `[asy]` figure), and
    inside a formula (`math` only)."""
    n = len(cot)
    whole, formula = [False] * n, [False] * n
    for m in _ANNOTATION.finditer(cot):
        whole[m.start():m.end()] = [True] * (m.end() - m.start())
    if not math:
        return whole, formula
    i = 0
    while i < n:
        if cot.startswith("\\$", i):
            i += 2
            continue
        if cot.startswith(_ASY[0], i):
            end = cot.find(_ASY[1], i)
            end = n if end < 0 else end + len(_ASY[1])
            whole[i:end] = [True] * (end - i)
            i = end
            continue
        opened = next(((o, c) for o, c in _MATH_OPEN if cot.startswith(o, i)), None)
        if opened is None:
            i += 1
            continue
        j = i + len(opened[0])
        while j < n and not cot.startswith(opened[1], j):  # an unclosed formula runs to the end
            j += 2 if cot.startswith("\\$", j) or cot.startswith("\\\\", j) else 1
        end = min(n, j + len(opened[1]))
        formula[i:end] = [True] * (end - i)
        i = end
    return whole, formula


def split_steps(cot: str, style: str = AUTO) -> list[str]:
    """`cot` cut into its steps, in order (see the module docstring); [] for a blank CoT.

    style: one of STEP_STYLES. Raises ValueError for another."""
    if style not in STEP_STYLES:
        raise ValueError(f"step style must be one of {'|'.join(STEP_STYLES)}, got {style!r}")
    if style == AUTO:
        style = step_style(cot)
    words = list(_WORD.finditer(cot))
    if not words:
        return []
    whole, formula = _mask(cot, style == MATH)
    cuts = [0]
    for k in range(len(words) - 1):
        gap = words[k].end()  # the first whitespace character after word k
        if whole[gap]:
            continue
        word, nxt = words[k].group(), words[k + 1].group()
        if style == EQUATIONS:
            cut = word.endswith(">>")
        else:
            line_break = "\n" in cot[gap:words[k + 1].start()]
            sentence = (bool(_SENTENCE_END.search(word)) and not nxt[0].islower()
                        and not (style == MATH and formula[gap]))
            cut = line_break or sentence
        if cut:
            cuts.append(k + 1)
    cuts.append(len(words))
    return [cot[words[a].start():words[b - 1].end()] for a, b in zip(cuts, cuts[1:], strict=False)]
