"""BENCHMARKS.md is today's numbers: short, a summary table first, every section the bench code writes in place,
and the history (and an index of results/) outside it."""

from __future__ import annotations

import re
from pathlib import Path

from dlr_jax.bench import cli, common

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "BENCHMARKS.md"
MAX_LINES = 600
# What writes a section: the CLI's benchmarks, sampling's and grpo_peers' GPU variants, plan_report's "plan";
# experiments_main holds the `experiments main` table (README cites it by name).
SECTIONS = (*cli.BENCHMARKS, "sampling_gpu", "grpo_peers_gpu", "plan", "experiments_main", "gpu")


def lines() -> list[str]:
    return DOC.read_text().splitlines()


def summary(text: list[str]) -> tuple[list[str], list[str]]:
    """(the paragraph between the title and the table, the table's rows)."""
    i = 1
    while i < len(text) and not text[i].strip():
        i += 1
    para = []
    while i < len(text) and text[i].strip() and not text[i].startswith("|"):
        para.append(text[i])
        i += 1
    while i < len(text) and not text[i].strip():
        i += 1
    table = []
    while i < len(text) and text[i].startswith("|"):
        table.append(text[i])
        i += 1
    return para, table


def test_benchmarks_md_is_at_most_600_lines():
    n = len(lines())
    assert n <= MAX_LINES, f"BENCHMARKS.md has {n} lines (at most {MAX_LINES}): move history to results/history/"


def test_benchmarks_md_starts_with_the_summary_table():
    text = lines()
    assert text[0] == "# Benchmarks"
    para, table = summary(text)
    assert len(para) <= 6, f"a short paragraph at most before the summary table, got {len(para)} lines"
    assert table, "the summary table must follow the title and its paragraph"
    header = [c.strip().lower() for c in table[0].strip("|").split("|")]
    assert header == ["benchmark", "ours", "peer", "ratio", "machine", "command"]
    assert len(table) >= 2 + 10  # header, separator, one row a benchmark
    assert all(row.count("|") == table[0].count("|") for row in table), "a summary row with a wrong column count"


def test_summary_names_no_dates_or_commits():
    para, table = summary(lines())
    text = "\n".join(para + table)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dates belong in the sections, not the summary"
    assert not re.search(r"\b\d{1,2}:\d{2}\b", text), "clock times belong in the sections, not the summary"
    commits = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert not commits, f"commit ids in the summary: {commits}"


def test_every_section_the_bench_code_writes_is_in_place_once():
    text = DOC.read_text()
    for name in SECTIONS:
        assert text.count(f"<!-- bench:{name} -->\n") == 1, name
        assert text.count(f"<!-- /bench:{name} -->\n") == 1, name
        # write_section replaces the marked lines in place (no appended duplicate at the end)
        out = common.update_section(text, name, f"## {name}\nnew body\n", source="BENCHMARKS.md")
        assert out.count(f"<!-- bench:{name} -->") == 1
        assert out.index(f"<!-- bench:{name} -->") == text.index(f"<!-- bench:{name} -->")


def test_history_and_results_index_exist():
    assert (REPO / "results" / "history" / "benchmarks-before-2026-11-29.md").is_file()
    index = (REPO / "results" / "README.md").read_text()
    for folder in sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir()):
        assert f"## {folder}/" in index, f"results/README.md does not index results/{folder}/"
