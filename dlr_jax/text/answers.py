"""Answer extraction and scoring: shared by ``evaluate.py`` (Pass@1) and the RL answer reward (R_ans,
``dlr_jax.rewards.answer_format``), so the two can never disagree. ``dlr_jax.rewards.answer_format`` re-exports
every public name.

Float-artifact golds. GSM-Hard targets are Python floats printed with ``repr`` (``3244047.0999999996``,
``0.30000000000000004``, ``14053029.666666666``). Exact rational comparison would reject the number a
person writes (``3244047.1``), so a gold that is a terminating decimal needing more than 12 significant
digits (``format(float(g), ".12g")`` differs from it) is an *artifact gold* and also accepts:

1. ``G`` rounded (half away from zero) to ``k`` decimals, for every ``k >= k*``, where ``k*`` is the fewest
   decimals whose rounding lies within ``tol = min(1e-9 * max(1, |G|), 0.01)`` of ``G``.
   ``3244047.0999999996 -> 3244047.1``; ``14053029.666666666 -> 14053029.67, 14053029.667, ...`` (not
   ``14053029.7``); ``0.30000000000000004 -> 0.3``. The 0.01 cap keeps large golds from accepting a
   rounded integer (``9284017268534.4`` does not accept ``9284017268534``).
2. Any prediction within float noise of ``G`` (``1e-12`` relative, same cap): the exact value of a
   repeating decimal (``42159089/3`` for ``14053029.666666666``) or extra digits.

Every other comparison is exact: ``18.01 != 18``, and ``3244047.2`` is rejected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np

__all__ = ["KNOWN_BENCHMARKS", "MATH_BENCHMARKS", "NUMERIC_BENCHMARKS", "answer_reward", "extract_answer", "is_correct"]

NUMERIC_BENCHMARKS = ("gsm8k", "gsm8k_aug", "gsm_hard", "svamp", "multiarith", "synthetic", "synthetic_hard",
                      "synthetic_reworded")
MATH_BENCHMARKS = ("math", "math500", "math_train")
KNOWN_BENCHMARKS = NUMERIC_BENCHMARKS + MATH_BENCHMARKS

# ---------------------------------------------------------------------------------------------- parsing

# A number as people write it: sign, digits with optional thousands commas, decimals, optional /denominator.
# The look-behind keeps the minus of "5-3" and the digits of "x2" or "1.5" tails out of the match.
_NUM = r"(?<![\w.)\]}])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?<![\w.)\]}])-?\.\d+"
_NUM_RE = re.compile(_NUM)
_FULL_NUM_RE = re.compile(rf"^(?:{_NUM})$")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
# Number at the start of a span, followed by prose or the end ("42 because ...", "1,000 dollars.").
_LEADING_NUM_RE = re.compile(rf"^({_NUM})(?=\s+[A-Za-z]|[.;!?](?:\s|$)|$)")
_MARKER_RE = re.compile(r"####|answer\s+is\b\s*:?|answer\s*:", re.IGNORECASE)
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$|^(-?)\\[dt]?frac(\d)(\d)$")
_FRACTION_LITERAL_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?(?:/\d+)?$")
_SPECIAL_TOKEN_RE = re.compile(r"<\|[^|]*\|>|</s>|<eos>|<pad>")


def _braced(text: str, start: int) -> tuple[str, int]:
    """Content of the ``{...}`` group opening at ``text[start]`` (tolerates a missing close at the end)."""
    depth, i = 0, start
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return text[start + 1 :], len(text)


def _last_boxed(text: str) -> str | None:
    pos = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if pos < 0:
        return None
    rest = text[pos:]
    m = re.match(r"\\(?:boxed|fbox)\s*(\{)?", rest)
    if m is None:
        return None
    if m.group(1):
        return _braced(rest, m.end() - 1)[0]
    tail = rest[m.end() :].split()
    return tail[0] if tail else ""  # "\boxed 5"


def _normalise_number(s: str) -> str:
    s = s.replace(" ", "")
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    return s


def _clean_span(span: str) -> str:
    """Strip delimiters, units-of-format and punctuation around an answer span; keep its sign and content."""
    s = _SPECIAL_TOKEN_RE.sub("", span).strip()
    boxed = _last_boxed(s)
    if boxed is not None:
        s = boxed.strip()
    for a, b in (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"), ("$", "$"), ("**", "**"), ("`", "`")):
        if len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a) : len(s) - len(b)].strip()
    s = s.replace("\\$", "").replace("\\%", "").replace("{,}", ",").replace("\\!", "").replace("\\,", "")
    s = s.replace("$", "").replace("%", "").replace("\u2212", "-").strip()
    s = s.rstrip(".").strip()
    lead = _LEADING_NUM_RE.match(s)
    if lead:
        s = lead.group(1)
    if _FULL_NUM_RE.match(s.replace(" ", "")):
        s = _normalise_number(s)
    return s


def extract_answer(text: str) -> str | None:
    """The final answer in a generated text, or None.

    Precedence: the last ``<answer> ... </answer>`` span (a missing ``</answer>`` at the end of text is
    tolerated; an empty span gives None), else the last ``\\boxed{...}``, else the text after the last
    marker (``####``, ``... answer is``, ``answer:``; case-insensitive; the rest of that line), else the
    last number in the text. The span is cleaned: ``\\boxed{}``, ``$``/``\\(...\\)`` delimiters, ``$``,
    ``%``, thousands commas, a trailing ``.``, surrounding whitespace; a leading number followed by prose
    is kept alone (``"42 because ..." -> "42"``). Signs are kept. Non-numeric spans (LaTeX, intervals)
    come back cleaned but otherwise verbatim, for math-verify.

    Callers decoding latent tokens to text should skip them: the last-number fallback would otherwise
    read digits out of latent token names.
    """
    if not text:
        return None
    open_pos = text.rfind("<answer>")
    if open_pos >= 0:
        body = text[open_pos + len("<answer>") :]
        close = body.find("</answer>")
        span = _clean_span(body if close < 0 else body[:close])
        return span or None
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return _clean_span(boxed) or None
    markers = list(_MARKER_RE.finditer(text))
    if markers:
        rest = text[markers[-1].end() :].lstrip(" \t:")
        line = rest.strip().split("\n", 1)[0] if rest.strip() else ""
        span = _clean_span(line)
        if span:
            return span
    numbers = _NUM_RE.findall(text)
    return _normalise_number(numbers[-1]) if numbers else None


def _to_fraction(s: str) -> Fraction | None:
    s = _clean_span(s).replace(" ", "")
    m = _FRAC_RE.match(s)
    if m:
        sign, num, den = (m.group(1), m.group(2), m.group(3)) if m.group(2) else m.group(4, 5, 6)
        s = f"{sign}{num}/{den}"
    s = _normalise_number(s)
    # Checked before Fraction() so "1e999999999" cannot make a billion-digit integer.
    if not _FRACTION_LITERAL_RE.match(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _numeric_value(prediction: str) -> Fraction | None:
    """The prediction's value; falls back to its last number ("18 apples", "6*7 = 42")."""
    value = _to_fraction(prediction)
    if value is not None:
        return value
    numbers = _NUM_RE.findall(prediction)
    return _to_fraction(numbers[-1]) if numbers else None


def _round_half_up(x: Fraction, k: int) -> Fraction:
    q = Fraction(10) ** k
    n = x * q
    r = math.floor(abs(n) + Fraction(1, 2))
    return Fraction(r if n >= 0 else -r) / q


@lru_cache(maxsize=65536)
def _gold_acceptor(gold: str) -> tuple[Fraction, tuple[Fraction, ...], Fraction]:
    """(exact gold, extra accepted roundings, noise tolerance) — see the module docstring."""
    g = _to_fraction(gold)
    if g is None:
        g = _to_fraction(extract_answer(gold) or "")
    if g is None:
        raise ValueError(f"gold answer {gold!r} is not a number (expected e.g. '18', '-3.5', '3/4', '1,000')")
    den = g.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:  # "1/3" is exact as written, not a float printed to 17 digits
        return g, (), Fraction(0)
    try:
        short = Fraction(format(float(g), ".12g"))
    except OverflowError:
        return g, (), Fraction(0)
    if short == g:
        return g, (), Fraction(0)
    tol = min(Fraction(1, 10**9) * max(Fraction(1), abs(g)), Fraction(1, 100))
    roundings: list[Fraction] = []
    for k in range(0, 40):
        d = _round_half_up(g, k)
        if d == g:  # rounding at >= the gold's own precision: nothing more to add
            break
        if roundings or abs(d - g) <= tol:
            roundings.append(d)
    return g, tuple(roundings), min(Fraction(1, 10**12) * max(Fraction(1), abs(g)), tol)


def _numeric_correct(prediction: str, gold: str) -> bool:
    p = _numeric_value(prediction)
    if p is None:
        return False
    g, roundings, noise = _gold_acceptor(str(gold).strip())
    return p == g or p in roundings or (noise > 0 and abs(p - g) <= noise)


# ------------------------------------------------------------------------------------------------- MATH


def _latex_wrap(s: str) -> str:
    s = s.strip()
    if "$" in s or s.startswith(("\\(", "\\[")) or "\\boxed" in s:
        return s
    return f"${s}$"


def _plain_latex(s: str) -> str:
    """Last-resort string form for answers sympy cannot parse (``\\text{odd}`` vs ``{\\rm odd}``)."""
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\{\\rm\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\left|\\right|\\[,;!]|\$|\s", "", s)
    return s.lower()


@lru_cache(maxsize=8192)
def _parse_math(s: str) -> tuple:
    from math_verify import parse  # sympy import is slow: only pay it for MATH

    # Timeouts off: math-verify's timeouts use signals, which only work on the main thread.
    return tuple(parse(_latex_wrap(s), parsing_timeout=None))


def _math_correct(prediction: str, gold: str) -> bool:
    from math_verify import verify

    p, g = _to_fraction(prediction), _to_fraction(gold)
    if p is not None and p == g:
        return True
    gold_parsed, pred_parsed = _parse_math(gold), _parse_math(prediction)
    if gold_parsed and pred_parsed and verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None):
        return True
    return _plain_latex(prediction) == _plain_latex(gold) != ""


def is_correct(prediction: str | None, gold: str, benchmark: str) -> bool:
    """Whether an extracted prediction answers ``gold`` on ``benchmark``.

    Numeric benchmarks (``gsm8k gsm8k_aug gsm_hard svamp multiarith``, ``synthetic`` and its variants): exact
    rationals after cleaning (``18.0 == 18``, ``1,000 == 1000``, ``$5 == 5``, ``50% == 50``, ``3/4 == 0.75``,
    ``-3 != 3``); a prediction that is not a bare number is read by its last number; float-artifact golds
    follow the rule in the module docstring. MATH (``math math500 math_train``): math-verify
    (``parse`` + ``verify``, timeouts off so it runs in any thread), then a normalised string match.
    A ``None`` prediction is wrong. A gold that is not a number on a numeric benchmark raises ValueError.
    """
    bench = benchmark.lower()
    if bench not in KNOWN_BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(KNOWN_BENCHMARKS)}")
    if prediction is None or not str(prediction).strip():
        return False
    if bench in MATH_BENCHMARKS:
        return _math_correct(str(prediction), str(gold))
    return _numeric_correct(str(prediction), str(gold))


def answer_reward(texts: Sequence[str], golds: Sequence[str], benchmark: str) -> np.ndarray:
    """R_ans: ``[B]`` float32, 1.0 where ``is_correct(extract_answer(text), gold, benchmark)``.

    Our reading: R_ans is the answer's correctness, and the paper gives no rule for a rollout without an
    ``<answer>`` span; here ``extract_answer``'s fallbacks (a boxed answer, a marker, the last number) still
    score one, while R_fmt pays for the span. Evaluation reads the span only unless
    ``eval.answer_fallback: last_number`` (dlr_jax/eval/scoring.py ``read_answer``)."""
    if len(texts) != len(golds):
        raise ValueError(f"answer_reward got {len(texts)} texts but {len(golds)} golds")
    if benchmark.lower() not in KNOWN_BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(KNOWN_BENCHMARKS)}")
    return np.asarray(
        [float(is_correct(extract_answer(t), g, benchmark)) for t, g in zip(texts, golds, strict=True)],
        dtype=np.float32,
    )
