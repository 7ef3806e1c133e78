"""README.md is written for a reader of today's project: short, no history in it (dates, commit ids, clock times
belong in results/history/ and BENCHMARKS.md), the 8-GPU recipe near the top, every file it names present, and its
figure redrawable by the committed script."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

MAX_LINES = 250
MAX_LINE_CHARS = 300
GPU_BLOCK_BY_LINE = 120

DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
CLOCK = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b")
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")


def _lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def test_readme_is_short():
    lines = _lines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"
    long = [(i, len(ln)) for i, ln in enumerate(lines, 1) if len(ln) > MAX_LINE_CHARS]
    assert not long, f"README.md lines over {MAX_LINE_CHARS} characters (line, length): {long}"


def test_readme_holds_no_history():
    """No date, clock time or commit id: a measurement's date and commit live with it in BENCHMARKS.md / results/."""
    for i, ln in enumerate(_lines(), 1):
        assert not DATE.search(ln), f"README.md:{i}: a date: {ln}"
        assert not CLOCK.search(ln), f"README.md:{i}: a clock time: {ln}"
        # a commit-id-like token: hex digits with at least one digit and one letter (not a plain number or word)
        ids = [t for t in HEX.findall(ln) if re.search(r"\d", t) and re.search(r"[a-f]", t)]
        assert not ids, f"README.md:{i}: commit-id-like {ids}: {ln}"


def test_the_8_gpu_recipe_is_near_the_top():
    lines = _lines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("## Full-scale run"))
    start = next(i for i in range(head, len(lines)) if lines[i] == "```bash")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == "```")
    block = lines[start:end]
    assert any(ln.startswith("launch/gpu_single_host.sh ") for ln in block)
    assert end + 1 <= GPU_BLOCK_BY_LINE, f"the 8-GPU block ends on line {end + 1} (at most {GPU_BLOCK_BY_LINE})"


def test_files_the_readme_names_exist():
    text = README.read_text(encoding="utf-8")
    named = set(re.findall(r"(?:configs|launch|docs)/[\w./-]+\.(?:yaml|sh|png|py|md)", text))
    named |= {m for m in re.findall(r"\]\(([^)#]+)\)", text) if not m.startswith("http")}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"README.md names files that do not exist: {missing}"
    public = {"load_hf", "save_hf", "grpo_loss", "group_advantages", "extract_answer", "is_correct", "render_cot",
              "quantize", "Sampler", "load_config"}
    assert all(f"`{name}(" in text for name in public), "README's public API table lists every exported name"


def test_the_pipeline_figure_script_runs(tmp_path):
    spec = importlib.util.spec_from_file_location("make_pipeline_figure", ROOT / "docs" / "make_pipeline_figure.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "pipeline.png"
    assert mod.main(["--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert (ROOT / "docs" / "pipeline.png").is_file()
