"""The interpretability report: rows, a standalone page, and what headless Chromium shows of it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.eval import interpret
from tests.micro import codebook_nets, untrained_workdir

ROOT = Path(__file__).resolve().parents[2]
MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=60", "data.synthetic_eval=8",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", "latent.num_latents=16",
    "latent.latent_dim=16", "latent.source=random", "mesh.fsdp=1", "sampling.prompt_bucket=16",
    "eval.max_new_tokens=16", "eval.max_latents=4", "eval.batch_size=4",
    *codebook_nets(num_queries=4), "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128",
    "codebook.max_text_len=24",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Untrained micro stages: the codebook stage's model (its OCR decoder reads the latents) and an sft
    latent LM on that codebook."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO)
    return untrained_workdir(cfg, tmp_path_factory.mktemp("interp"), with_codebook=True)


def test_rows_and_page_hold_every_element(workdir, tmp_path):
    rows = interpret.build_rows(workdir, benchmark="synthetic", n=3)
    assert interpret.default_stage(workdir) == "sft" and len(rows) == 3
    for r in rows:
        assert r["gold_image"].startswith("data:image/png;base64,") and r["gold_cot"]
        assert all(0 <= c < 16 for c in r["latent_codes"]) and r["n_latents"] == len(r["latent_codes"])
        assert isinstance(r["decoded_cot"], str) and isinstance(r["correct"], bool)
    page, lines = interpret.write_report(rows, tmp_path / "r.html", title="t")
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # standalone: no network assets
    assert text.count('class="card"') == 3 and text.count("<img") == 3
    for r in rows:
        assert r["question"] in text or r["question"].replace("'", "&#x27;") in text
    saved = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [s["id"] for s in saved] == [r["id"] for r in rows] and "gold_image" not in saved[0]


def test_cli_custom_question_has_no_gold(workdir, tmp_path, capsys):
    out = tmp_path / "q.html"
    assert interpret.main(["--workdir", str(workdir), "--question", "What is 3 plus 4?", "--html", str(out)]) == 0
    row = json.loads(out.with_suffix(".jsonl").read_text())
    assert row["question"] == "What is 3 plus 4?" and row["correct"] is None and row["gold_answer"] is None
    assert "<img" not in out.read_text() and "1 custom question" in capsys.readouterr().out


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_headless_chromium_shows_the_report(workdir, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on PATH: `apt-get install chromium` (Debian; .ci/run installs it)")
    from PIL import Image

    rows = interpret.build_rows(workdir, benchmark="synthetic", n=2)
    page, _ = interpret.write_report(rows, tmp_path / "r.html", title="Latent reasoning, decoded")
    shot = tmp_path / "shot.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1100,900",
           "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), done.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("L"), np.float32)
    assert img.std() > 5.0, "the screenshot is blank"
    dom = done.stdout  # the page as the browser built it: every element is there
    assert dom.count('class="card"') == 2 and len(re.findall(r"<img[^>]+data:image/png", dom)) == 2
    assert all(r["decoded_cot"] == "" or r["id"] in dom for r in rows)


def test_the_demo_ends_with_a_report_of_its_latents(workdir, capsys):
    """`make demo`'s last step (dlr_jax.demo.report_demo) on a workdir of the stages' formats."""
    from dlr_jax.config import load_config
    from dlr_jax.demo import DEMO_OVERRIDES, report_demo

    demo = load_config("configs/small/synthetic.yaml", list(DEMO_OVERRIDES))
    assert demo.latent.source == "codebook"  # the demo shows real latents unless told otherwise
    html = report_demo(workdir, "sft", "synthetic", n=3)
    assert html == workdir / "report.html" and html.stat().st_size > 0
    rows = [json.loads(line) for line in html.with_suffix(".jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["latent_codes"] is not None and "decoded_cot" in r for r in rows)
    assert "report.html" in capsys.readouterr().out


def test_a_step_codebook_shows_each_steps_image_codes_and_reading(workdir, tmp_path):
    """codebook.render_unit=step: the gold CoT's steps in order, and generated latents read one step at a time."""
    from dlr_jax.data.records import Example
    from dlr_jax.data.synthetic import SyntheticConfig, generate
    from dlr_jax.stages.codebook.models import load_decoder
    from dlr_jax.text.steps import split_steps

    cfg = load_config(ROOT / "configs" / "tiny.yaml",  # 128 px canvases: 4 codes a step
                      [*MICRO, "codebook.render_unit=step", "codebook.eval_batch_size=8"])
    examples = [*generate(2, seed=1, config=SyntheticConfig(cot_style="natural")),
                Example(f"{interpret.GOLDLESS}/0", "What is 3 plus 4?", "", "0", interpret.GOLDLESS)]
    decoder = load_decoder(workdir)
    panels = interpret.step_panels(cfg, workdir, examples, decoder)
    assert panels[2] is None  # no gold, no steps
    for ex, steps in zip(examples[:2], panels[:2], strict=True):
        assert [st["text"] for st in steps] == split_steps(ex.cot) and len(steps) >= 2
        assert all(len(st["codes"]) == 4 and st["image"].startswith("data:image/png;base64,") for st in steps)
        assert [st["decoded"] for st in steps] == decoder.decode([st["codes"] for st in steps])
    generated = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]
    read = interpret.latent_steps(generated, cfg.codebook, decoder)
    assert [[st["codes"] for st in r] for r in read] == [[[1, 2, 3, 4], [5, 6, 7, 8]], [[9, 10, 11]]]
    assert [st["decoded"] for st in read[0]] == decoder.decode([[1, 2, 3, 4], [5, 6, 7, 8]])
    mixed = load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.min_side=64"]).codebook
    assert interpret.latent_steps(generated, mixed, decoder) == [None, None]  # 1 or 4 codes a step: no cut

    row = {"id": "s/1", "question": "q", "gold_cot": examples[0].cot, "gold_answer": "1", "gold_image": None,
           "latent_codes": generated[0], "n_latents": 8, "decoded_cot": "", "prediction": "", "answer": "1",
           "correct": True, "steps": panels[0], "latent_steps": read[0]}
    page, lines = interpret.write_report([row], tmp_path / "s.html", title="t")
    text = page.read_text()
    assert text.count('class="stepcard"') == len(panels[0]) == text.count("<img")
    assert text.index(panels[0][0]["image"]) < text.index(panels[0][1]["image"])  # in order
    assert text.count('class="step"') == 2 and "read step by step" in text
    saved = json.loads(lines.read_text())
    assert [st["codes"] for st in saved["steps"]] == [st["codes"] for st in panels[0]]
    assert all("image" not in st for st in saved["steps"])
