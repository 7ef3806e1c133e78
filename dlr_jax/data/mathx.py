"""MathX-5M (XenArcAI, `XenArcAI/MathX-5M` on the Hugging Face hub, MIT): step-by-step solutions of math
problems, the third source of the paper's codebook corpus (a stratified 603K sample beside GSM8K-Aug and
MATH train).

The release is a folder of parquet files, `data/MathX-<n>.parquet` (`python -m dlr_jax.data.download
mathx_5m` fetches them into `<root>/mathx_5m/data/`). What is assumed of a record, from the dataset card and
code that reads it (no copy of the data was at hand when this was written): the problem is in `problem` or,
in some files, `question`; `generated_solution` is the worked solution, its reasoning between `<think>` and
`</think>`; `expected_answer` is the final answer. JSONL files with the same fields are read too (a user's
conversion, and the tests).

Each record becomes an `Example` whose CoT is the solution with the think tags taken out (the text the
codebook renders), id `mathx_5m/<file stem>/<row>` (0-based row of its file) and stratum its file.
`read_mathx(..., sample=n)` keeps n records drawn as `protocol.stratified_sample` would draw them, file by
file, without holding the whole release (millions of long solutions) in memory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dlr_jax.data.protocol import SampleTooLarge, allocate, pick
from dlr_jax.data.records import DataFormatError, Example, iter_jsonl

SOURCE = "mathx_5m"
QUESTION_FIELDS = ("problem", "question")  # the files differ in which one they carry
SOLUTION_FIELD = "generated_solution"
ANSWER_FIELD = "expected_answer"
_THINK = re.compile(r"</?think>")


def solution_cot(solution: str) -> str:
    """The solution without its `<think>` / `</think>` markers: the reasoning, then what follows it."""
    return "\n".join(part.strip() for part in _THINK.split(solution) if part.strip())


def data_files(path: str | Path) -> list[Path]:
    """The parquet / JSONL files of a MathX copy: `path` itself, or the files in the folder (sorted by name)."""
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(f for f in path.iterdir() if f.suffix in (".parquet", ".jsonl")) if path.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{path}: no MathX-5M *.parquet or *.jsonl files (get them with "
                                f"`python -m dlr_jax.data.download mathx_5m --to DIR`)")
    stems = [f.stem for f in files]
    if len(set(stems)) != len(stems):  # a file's stem is its records' id prefix and their stratum
        raise ValueError(f"{path}: two files share a name stem ({sorted(s for s in stems if stems.count(s) > 1)[0]})")
    return files


def _row_id(source: str, f: Path, row: int) -> str:
    return f"{source}/{f.stem}/{row}"


def _example(obj: Any, f: Path, row: int, source: str, line: int | None) -> Example:
    where = {"line": line} if line is not None else {"index": row}
    if not isinstance(obj, dict):
        raise DataFormatError(f, f"expected a record, got {type(obj).__name__}", **where)
    fields = [k for k in QUESTION_FIELDS if isinstance(obj.get(k), str)]
    if not fields:
        raise DataFormatError(f, f"no problem text: expected a string field 'problem' or 'question' (fields "
                                 f"present: {sorted(obj)})", **where)
    solution, answer = obj.get(SOLUTION_FIELD), obj.get(ANSWER_FIELD)
    if not isinstance(solution, str):
        raise DataFormatError(f, f"field {SOLUTION_FIELD!r} should be a string, got {type(solution).__name__}",
                              **where)
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise DataFormatError(f, f"field {ANSWER_FIELD!r} should be a string, got {type(answer).__name__}", **where)
    return Example(id=_row_id(source, f, row), question=obj[fields[0]], cot=solution_cot(solution),
                   answer=str(answer).strip(), source=source,
                   extra={"stratum": f.stem, "row": row, **({"line": line} if line is not None else {})})


def _parquet_rows(f: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(f).metadata.num_rows


def _read_parquet(f: Path, rows: list[int] | None, source: str) -> list[Example]:
    """The records of one parquet file (only `rows`, 0-based, when given)."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except Exception as e:  # pyarrow raises its own error types for a file that is not parquet
        raise DataFormatError(f, f"not a readable parquet file ({e})") from None
    names = pf.schema_arrow.names
    columns = [c for c in (*QUESTION_FIELDS, SOLUTION_FIELD, ANSWER_FIELD) if c in names]
    table = pf.read(columns=columns)
    index = list(range(table.num_rows)) if rows is None else rows
    if rows is not None:
        table = table.take(rows)
    return [_example(obj, f, row, source, None) for row, obj in zip(index, table.to_pylist(), strict=True)]


def _read_jsonl(f: Path, rows: set[int] | None, source: str) -> list[Example]:
    out = []
    for row, (line, obj) in enumerate(iter_jsonl(f, raw_floats=False)):
        if rows is None or row in rows:
            out.append(_example(obj, f, row, source, line))
    return out


def _count(f: Path) -> int:
    return _parquet_rows(f) if f.suffix == ".parquet" else sum(1 for _ in iter_jsonl(f, raw_floats=False))


def count_rows(path: str | Path) -> int:
    """The records under `path` (parquet: from the files' metadata, no record is read)."""
    return sum(_count(f) for f in data_files(Path(path) / "data" if (Path(path) / "data").is_dir() else path))


def read_mathx(path: str | Path, *, split: str = "train", sample: int = 0, seed: int = 0,
               source: str = SOURCE) -> list[Example]:
    """Every record of the files under `path` (one file or a folder), or (sample > 0) a stratified sample of
    `sample` of them, strata = files (the paper does not say what its 603K were stratified by). `split` is
    only a name: the release has one split, train."""
    del split
    files = data_files(path)
    chosen: dict[Path, list[int] | None] = dict.fromkeys(files)
    if sample > 0:
        sizes = {f: _count(f) for f in files}
        total = sum(sizes.values())
        if sample > total:
            raise SampleTooLarge(f"{path}: a sample of {sample:,} asked of {total:,} MathX-5M records (the full "
                                 "release is millions: `python -m dlr_jax.data.download mathx_5m`)")
        quota = allocate({str(f): n for f, n in sizes.items()}, sample)
        for f in files:
            ids = [_row_id(source, f, r) for r in range(sizes[f])]
            keep = pick(ids, quota[str(f)], seed)
            chosen[f] = [r for r, i in enumerate(ids) if i in keep]
    out: list[Example] = []
    for f, rows in chosen.items():
        if rows is not None and not rows:
            continue
        if f.suffix == ".parquet":
            out += _read_parquet(f, rows, source)
        else:
            out += _read_jsonl(f, None if rows is None else set(rows), source)
    return out
