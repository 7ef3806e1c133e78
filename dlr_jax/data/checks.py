"""Load-time checks of benchmark data, with file:line: numeric golds where scoring is numeric, and
no empty files. `load_benchmark` runs them, so a bad gold fails at load (naming file and line)
instead of at scoring time, and an empty file never trains a tokenizer on nothing (which made the
next, fixed run fail with a misleading "dropped 200 of 200 examples")."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from dlr_jax.data.records import DataFormatError, Example

# Benchmarks whose golds are numbers (MATH's and MathX-5M's are LaTeX).
NON_NUMERIC = ("math500", "math_train", "mathx_5m")
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|[-+]?\d+/\d+")


def is_number(text: str) -> bool:
    return bool(_NUMBER.fullmatch(text.strip()))


def check_numeric_golds(examples: Iterable[Example], benchmark: str, path: str | Path | None) -> None:
    """Raises DataFormatError at the first non-numeric gold of a numeric benchmark."""
    if benchmark in NON_NUMERIC:
        return
    for ex in examples:
        if not is_number(ex.answer):
            where = dict(line=ex.extra.get("line"), index=ex.extra.get("index"))
            raise DataFormatError(
                path or f"<{benchmark}>",
                f"gold answer {ex.answer!r:.60} of example {ex.id} is not a number ({benchmark} is scored "
                "numerically)", **where)


def check_not_empty(examples: list[Example], what: str | Path) -> None:
    if not examples:
        raise DataFormatError(what, "no examples in this file (empty?): refusing to go on with no data")
