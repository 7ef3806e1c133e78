"""GSM8K (openai/grade-school-math): JSONL `{"question", "answer"}`.

`answer` is a worked solution with calculator annotations `<<48/2=24>>` and a last line `#### 72`.
The equation-only chain of thought joins the annotations with single spaces,
`<<48/2=24>> <<48+24=72>>`, which is exactly how GSM8K-Aug writes its CoTs (checked on the test
split: all 1,319 GSM8K-Aug test lines equal this rendering of the GSM8K test file), so GSM8K train
can stand in for GSM8K-Aug-style training data.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from dlr_jax.config.root import GSM8K_COTS
from dlr_jax.data.records import DataFormatError, Example, clean_number_text, iter_jsonl, require

ANNOTATION = re.compile(r"<<(.*?)>>", flags=re.S)

CotStyle = Literal["equations", "natural", "raw"]


def equation_cot(solution: str) -> str:
    """`"... = <<48/2=24>>24 ... <<48+24=72>>72 ..."` -> `"<<48/2=24>> <<48+24=72>>"`."""
    return " ".join(f"<<{a}>>" for a in ANNOTATION.findall(solution))


def natural_cot(solution: str) -> str:
    """The worked solution with calculator annotations removed."""
    return ANNOTATION.sub("", solution).strip()


# the chain each `cot` style (config.root.GSM8K_COTS, data.gsm8k_cot) reads from a worked solution
COT_TEXT = {"equations": equation_cot, "raw": lambda s: s, "natural": natural_cot}


def split_solution(answer_field: str) -> tuple[str, str] | None:
    """`"steps\\n#### 72"` -> ("steps", "72"); None when there is no `####` line."""
    idx = answer_field.rfind("####")
    if idx < 0:
        return None
    final = answer_field[idx + 4 :].strip()
    return answer_field[:idx].rstrip(), final


def read_gsm8k(path: str | Path, *, split: str = "test", cot: CotStyle = "equations") -> list[Example]:
    """Reads a GSM8K JSONL file.

    cot: "equations" (default) -> `<<a*b=c>> <<c+d=e>>`; "natural" -> the solution text without
    annotations; "raw" -> the solution text as in the file (without the `####` line).
    The full solution is kept in `extra["solution"]`; `extra["line"]` is the 1-based line.
    """
    if cot not in GSM8K_COTS:
        raise ValueError(f"cot must be {'|'.join(GSM8K_COTS)}, got {cot!r}")
    to_cot = COT_TEXT[cot]
    path = Path(path)
    out: list[Example] = []
    for lineno, obj in iter_jsonl(path):
        question = require(obj, "question", str, path, line=lineno)
        answer_field = require(obj, "answer", str, path, line=lineno)
        parts = split_solution(answer_field)
        if parts is None or not parts[1]:
            raise DataFormatError(
                path, "expected the 'answer' field to end with a line '#### <number>'", line=lineno
            )
        solution, final = parts
        if solution.count("<<") != solution.count(">>"):
            raise DataFormatError(
                path, "unbalanced '<<' / '>>' calculator annotations in 'answer'", line=lineno
            )
        text = to_cot(solution)
        out.append(
            Example(
                id=f"gsm8k/{split}/{len(out)}",
                question=question.strip(),
                cot=text,
                answer=clean_number_text(final),
                source="gsm8k",
                extra={"solution": solution, "answer_raw": final, "line": lineno},
            )
        )
    return out
