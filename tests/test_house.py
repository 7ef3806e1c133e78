"""House rules ruff and lint-imports do not check (CONTRIBUTING.md, "Lint"); `make lint` runs this file.

- The package root holds entry points only: at most MAX_ROOT_MODULES modules in `dlr_jax/*.py`.
- No private name is imported across modules (`from m import _name`), in `dlr_jax/` or `tests/`: a helper two
  modules share is public, and lives where both may import it.
- Comments and docstrings of `dlr_jax/` say why, not how fast: no benchmark figure (a speed-up, a time, a
  rate, a date). A measurement belongs to BENCHMARKS.md; the code names the benchmark that made it.
- Every package of `dlr_jax/` has its mirror under `tests/`, with an `__init__.py`.

Each failure names the file and line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlr_jax"
TESTS = ROOT / "tests"
MAX_ROOT_MODULES = 6

# A benchmark figure in prose. Ratios only count where they read as a measurement (a speed word, a range, a
# "~"), so that a definition ("a 16x compressor", "2x the reference length", "10x as large") passes.
_NUM = r"(?<![\w.])\d+(?:[.,]\d+)?"
_X = r"\s?[x×]"
_SPEED_WORD = r"(?:faster|slower|longer|shorter|quicker|more|less|fewer|speed-?ups?|the speed|the time|as fast|as slow)"
FIGURE = re.compile("|".join([
    rf"{_NUM}{_X}\s+{_SPEED_WORD}\b",  # 1.3x faster, 4x longer to compile
    rf"{_NUM}\s?(?:-|–|to)\s?{_NUM}{_X}(?![\w×])",  # 1.11-1.19x
    rf"[~≈]\s?{_NUM}{_X}(?![\w×])",  # ~5x
    rf"\d\.\d+{_X}(?![\w×])(?!\s+(?:the|as|larger|smaller|bigger|wider|its|their)\b)",  # (1.27x), 1.19x on ...
    r"speed-?up of [~≈]?\d",
    rf"{_NUM}\s?%\s+(?:faster|slower|longer|shorter|quicker)\b",  # ~30 % slower
    rf"{_NUM}\s?(?:ms|µs|us|s|sec|min)\b(?![-/])",  # 12 ms), 17 s vs 5 s, 12 min
    rf"{_NUM}\s?(?:[KMGTP]?FLOP/s|[KMGTP]i?B/s|(?:tokens|images|steps|examples|samples|chars|batches)/s)",
    rf"{_NUM}\s?[GTP]FLOPs?\b",  # 30 GFLOP (a measured op count)
    r"\b20\d\d-[01]\d-[0-3]\d\b",  # a date
    r"\b[0-2]\d:[0-5]\d\s?UTC\b",  # a time of day
    r"\b(?:Xeon|EPYC|Graviton)\b",  # the host a number was measured on
]))
# Not figures, whatever FIGURE says: a shape (2x2x2, 4 x 4, [16 x 512]), a compile target's vendor peak in a
# Markdown table row ("| 989 TFLOP/s | 3.35 TB/s |": a datasheet value the planner divides by).
ALLOWED = [
    re.compile(r"\d+(?:\s?[x×]\s?\d+)+"),
    re.compile(r"(?<=\|)[^|]*\d\s?(?:TFLOP/s|TB/s)[^|]*(?=\|)"),
]


def _py_files(*roots: Path) -> list[Path]:
    return sorted(p for r in roots for p in r.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every docstring line (any bare string statement: a module's, a
    class's, a function's, an attribute's), never a string used as data."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for i, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + i, line


def figures(text: str) -> list[str]:
    """The benchmark figures in one line of prose, after the allowed patterns are taken out."""
    for allowed in ALLOWED:
        text = allowed.sub(" ", text)
    return [m.group(0) for m in FIGURE.finditer(text)]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_module(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports(path: Path, source: str) -> list[str]:
    """`from m import _name` where m is another module than `path`'s own (its package's `__init__` included)."""
    own, out = _module_name(path), []
    for node in ast.walk(ast.parse(source, _rel(path))):
        if isinstance(node, ast.ImportFrom):
            module = _imported_module(path, node)
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.endswith("__")
                if private and module != own:
                    out.append(f"{_rel(path)}:{node.lineno}: from {module} import {alias.name}")
    return out


def test_package_root_holds_entry_points_only():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, (
        f"dlr_jax/ holds {len(modules)} modules ({', '.join(modules)}), at most {MAX_ROOT_MODULES}: "
        "a new module belongs in the package of its concern (CONTRIBUTING.md, 'Layers')")


def test_no_private_name_is_imported_across_modules():
    bad = [hit for path in _py_files(PACKAGE, TESTS) for hit in private_imports(path, path.read_text())]
    assert not bad, ("private names imported across modules (make the name public where both may import it):\n"
                     + "\n".join(bad))


def test_comments_and_docstrings_quote_no_benchmark_figure():
    bad = []
    for path in _py_files(PACKAGE):
        for line, text in prose(path.read_text(), _rel(path)):
            found = figures(text)
            if found:
                bad.append(f"{_rel(path)}:{line}: {found} in {text.strip()!r}")
    assert not bad, ("benchmark figures in comments or docstrings: say why the code is so, and name the benchmark "
                     "(BENCHMARKS.md section, `python -m dlr_jax.bench --only NAME`) instead of its numbers:\n"
                     + "\n".join(bad))


def test_every_package_has_a_test_mirror():
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        mirror = TESTS / init.parent.relative_to(PACKAGE) / "__init__.py"
        if not mirror.is_file():
            missing.append(f"{_rel(init)}:1: no {_rel(mirror)}")
    assert not missing, "packages without a test mirror folder:\n" + "\n".join(missing)


def test_the_figure_check_tells_measurements_from_definitions():
    for text in ["the step is 1.3x faster", "(32 -> 24 ms on the sampling benchmark)", "120 GFLOP/s",
                 "measured on 2026-11-28", "the loop is 1.11-1.19x on an SFT gradient", "(90 -> 59 s)",
                 "~5x slower", "(1.27x)", "at 6.8 GB/s", "31-44 images/s", "compiled 3.6x longer", "12 min 17 s",
                 "~30 % slower", "the 2-core Intel Xeon"]:
        assert figures(text), text
    for text in ["a 16x convolutional compressor", "v5p:2x2x2", "logits [B, T, V]", "a 4x4 topology",
                 "N = (L/64)^2", "capped at 2x the reference length", "numbers 10x as large",
                 "glyphs 1.5x larger (the text covers 2.25x the area)", "| h100 | 80 GiB | 989 TFLOP/s | 3.35 TB/s |",
                 "Llama-3.x checkpoints", "[16 x 512] @ [512 x 1536]", "seconds per step", "images/s per core",
                 "(loss_sum, weight, metric sums)", "2 x (matmul params) per token"]:
        assert not figures(text), (text, figures(text))
