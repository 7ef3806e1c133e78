"""The common record type, the format error, and small parsing helpers shared by the readers.

Every reader turns its file into a list of `Example`s. A record that does not have the expected
shape raises `DataFormatError` naming the file and the 1-based line (JSONL / txt) or the 0-based
item index (JSON arrays); nothing is dropped quietly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class DataFormatError(ValueError):
    """A data file does not have the expected format.

    `path` is the file, `line` the 1-based line (line formats) and `index` the 0-based item index
    (JSON arrays); whichever applies is set, the other is None.
    """

    def __init__(
        self, path: str | os.PathLike, message: str, *, line: int | None = None, index: int | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.index = index
        self.message = message
        super().__init__(self.at(self.path))

    def at(self, source: str) -> str:
        """The error as if `source` (e.g. the URL a downloaded file came from) had been read: its location
        and the message."""
        if self.line is not None:
            return f"{source}:{self.line}: {self.message}"
        if self.index is not None:
            return f"{source} [item {self.index}, 0-based]: {self.message}"
        return f"{source}: {self.message}"


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem.

    id:       stable identifier, e.g. "gsm8k/test/17", "chal-1", "test/algebra/12.json".
    question: the prompt text a model sees.
    cot:      chain of thought; for GSM8K / GSM8K-Aug / synthetic the equation-only form
              "<<a*b=c>> <<c+d=e>>", for MATH the worked solution, "" where the benchmark has none.
    answer:   the gold answer as a person writes it: signs kept, thousands separators removed,
              "12.0" written as "12"; non-integral float golds keep their raw text (GSM-Hard's
              "3244047.0999999996"); MATH answers are the LaTeX string verbatim.
    source:   benchmark name ("gsm8k", "svamp", ...).
    extra:    benchmark-specific fields (original solution, equation, subject, level...).
    """

    id: str
    question: str
    cot: str
    answer: str
    source: str
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "cot": self.cot,
            "answer": self.answer,
            "source": self.source,
            "extra": dict(self.extra),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Example:
        return Example(
            id=str(d["id"]),
            question=d["question"],
            cot=d.get("cot", ""),
            answer=str(d["answer"]),
            source=d.get("source", ""),
            extra=dict(d.get("extra", {})),
        )


_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?")
_TRAILING_DOT = re.compile(r"[-+]?\d+\.")
_INTEGRAL_FLOAT = re.compile(r"[-+]?\d+\.0+")


def clean_number_text(text: str) -> str:
    """Normalises how a numeric gold is written without changing its value.

    "1,080" -> "1080", "36." -> "36", "51.0" -> "51"; anything else ("2/5", "0.5",
    "3244047.0999999996", "-7") is returned stripped but otherwise verbatim, so that the scorer sees
    the source's own digits.
    """
    s = text.strip()
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if _TRAILING_DOT.fullmatch(s):
        s = s[:-1]
    if _INTEGRAL_FLOAT.fullmatch(s):
        s = s.split(".")[0]
    return s


class RawFloat(str):
    """A JSON float kept as its source text (see `iter_jsonl`); a str subclass, so it can be told
    apart from a JSON string that merely looks like a number."""


NUMBER = (int, RawFloat)  # what a JSON number field is after reading with raw floats


def _not_utf8(path: Path, e: UnicodeDecodeError, line: int, column: int) -> DataFormatError:
    return DataFormatError(path, f"not valid UTF-8 (byte 0x{e.object[e.start]:02x} at column {column}); "
                                 "save the file as UTF-8", line=line)


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yields (1-based line number, line without its newline) for non-blank lines. A UTF-8 byte-order
    mark (a Windows editor's) is dropped; bytes that are not UTF-8 raise `DataFormatError` at their line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(path, e, lineno, e.start + 1) from None
            line = line.rstrip("\n").rstrip("\r")
            if line.strip():
                yield lineno, line


def iter_jsonl(path: Path, *, raw_floats: bool = True) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields (1-based line number, object) for each JSON object line.

    raw_floats: floats come back as their source text (`RawFloat`), so a gold such as
    3244047.0999999996 is not re-rounded by a float round trip.
    """
    for lineno, line in iter_lines(path):
        try:
            obj = json.loads(line, parse_float=RawFloat if raw_floats else float)
        except json.JSONDecodeError as e:
            raise DataFormatError(
                path, f"expected one JSON object per line ({e.msg}: column {e.colno})", line=lineno
            ) from None
        if not isinstance(obj, dict):
            raise DataFormatError(path, f"expected a JSON object, got {type(obj).__name__}", line=lineno)
        yield lineno, obj


def read_json_array(path: Path, *, raw_floats: bool = True) -> list[Any]:
    """Reads a file holding one JSON array (SVAMP, MultiArith)."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        body = e.object  # the bytes after a byte-order mark, which e.start counts in
        line_start = body.rfind(b"\n", 0, e.start) + 1
        raise _not_utf8(path, e, body.count(b"\n", 0, e.start) + 1, e.start - line_start + 1) from None
    try:
        data = json.loads(text, parse_float=RawFloat if raw_floats else float)
    except json.JSONDecodeError as e:
        raise DataFormatError(
            path, f"expected a JSON array ({e.msg}: column {e.colno})", line=e.lineno
        ) from None
    if not isinstance(data, list):
        raise DataFormatError(path, f"expected a top-level JSON array, got {type(data).__name__}")
    return data


def require(
    obj: Mapping[str, Any],
    key: str,
    types: type | tuple[type, ...],
    path: Path,
    *,
    line: int | None = None,
    index: int | None = None,
) -> Any:
    """Returns obj[key], raising DataFormatError when it is missing or of the wrong type."""
    if not isinstance(obj, Mapping):
        raise DataFormatError(
            path, f"expected a JSON object, got {type(obj).__name__}", line=line, index=index
        )
    if key not in obj:
        raise DataFormatError(
            path, f"missing field {key!r} (fields present: {sorted(obj)})", line=line, index=index
        )
    value = obj[key]
    wanted = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
        names = "/".join("number" if t is RawFloat else t.__name__ for t in wanted)
        raise DataFormatError(
            path,
            f"field {key!r} should be {names}, got {type(value).__name__} {value!r:.80}",
            line=line,
            index=index,
        )
    return value


def number_text(value: Any) -> str:
    """Text of a JSON number read with raw floats (or a plain int/float), cleaned."""
    if isinstance(value, bool):
        raise TypeError(f"expected a number, got bool {value!r}")
    if isinstance(value, int | float):
        value = repr(value)
    return clean_number_text(str(value))
