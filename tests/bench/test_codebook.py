"""The codebook throughput benchmark: a micro run through the CLI writes a sane section, the derived
numbers (ratios, render workers needed) and the verdict follow the measurements. No timing thresholds."""

from __future__ import annotations

import argparse
import math
import re

import pytest

from dlr_jax.bench import cli
from dlr_jax.bench import codebook as bench_codebook
from tests.micro import codebook_nets

# Micro networks, one canvas side (128 px): three compilations in all (encode, two step variants).
MICRO = [
    "codebook.min_side=128", "codebook.max_side=128", "codebook.image_size=128", "codebook.max_text_len=48",
    *codebook_nets(num_queries=4),
    "latent.num_latents=16", "latent.latent_dim=16", "codebook.train.batch_size=8",
]


def _numbers(cell: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"-?[\d,]*\.?\d+(?:e[-+]?\d+)?", cell)]


def test_cli_writes_the_section_with_sane_numbers(tmp_path, data_dir):  # reads gsm8k_aug:valid
    out = tmp_path / "B.md"
    out.write_text("# Benchmarks\n\nhand-written notes\n\n<!-- bench:train -->\nold train\n<!-- /bench:train -->\n")
    # train_alpha left out: each step variant is one more XLA compile of the codebook step.
    argv = ["--out", str(out), "--only", "codebook", "--repeats", "1", "--codebook-examples", "24",
            "--codebook-phases", "render,encode,train,live"]
    argv += [a for o in MICRO for a in ("--codebook-set", o)]
    cli.main(argv)
    text = out.read_text()
    assert "hand-written notes" in text and "old train" in text  # other content untouched
    body = text.split("<!-- bench:codebook -->\n", 1)[1].split("<!-- /bench:codebook -->", 1)[0]
    assert body.startswith("## Codebook stage") and "Command: `python -m dlr_jax.bench --out" in body
    # 24 CoTs at one side, batch 8: one epoch of 3 batches.
    assert "3 batches of 8 = 24 images, sides 128 px x 3 batches" in body
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in body.splitlines()
            if line.startswith("| ") and not line.startswith("| phase")}
    phases = ("render", "encode", "train", "live")
    assert len(rows) == len(phases)
    rates = {}
    for phase in phases:
        cells = rows[bench_codebook.LABELS[phase]]
        (rate,) = _numbers(cells[1])
        assert math.isfinite(rate) and rate > 0, (phase, cells)
        rates[phase] = rate
        if phase not in ("render", "live"):
            (side_rate,) = _numbers(cells[3])  # the 128-px column
            assert side_rate > 0
            (ratio,) = _numbers(cells[4])
            assert ratio == pytest.approx(rates["render"] / rate, rel=0.02, abs=0.051)  # printed to 0.1
            assert int(cells[5].rstrip(" |")) == max(1, math.ceil(rate / rates["render"]))
    assert "Interpretation: rendering" in body and "data.num_workers = 0" in body and "fed live" in body
    assert "alpha > 0" not in body.split("Interpretation")[1]
    (loss,) = _numbers(body.split("Loss after the last step ")[1].split(".\n")[0])
    assert math.isfinite(loss) and loss > 0


def _result(render_s: float, encode_s: float, train_s: float, workers: int = 0,
            live_s: float | None = None) -> bench_codebook.CodebookBenchResult:
    seconds = {"render": [render_s, 2 * render_s, render_s], "encode": [encode_s] * 3, "train_alpha": [2 * train_s] * 3,
               "train": [train_s] * 3, "live": [live_s or train_s] * 3}
    return bench_codebook.CodebookBenchResult(
        config="c.yaml", corpus="x:y", examples=100, batch_size=10, num_workers=workers, params=1000, describe="d",
        sides={128: 6, 192: 4}, tokens_per_image=6.0, repeats=3, phases=bench_codebook.PHASES, seconds=seconds,
        side_seconds={p: {128: [s[0] / 10] * 3} for p, s in seconds.items()}, first_s=dict.fromkeys(seconds, 1.0),
        last_loss=1.0)


def test_rates_ratios_and_workers_follow_the_measurements():
    res = _result(render_s=0.5, encode_s=0.2, train_s=10.0)  # 100 images: render 200/s (median), encode 500/s
    assert res.images == 100
    assert res.rate("render") == pytest.approx(200) and res.rate("encode") == pytest.approx(500)
    assert res.ratio("encode") == pytest.approx(0.4) and res.workers("encode") == 3  # ceil(500 / 200)
    assert res.ratio("train") == pytest.approx(20) and res.workers("train") == 1
    text = bench_codebook.interpret(res)
    assert text.startswith("rendering does not keep up") and "data.num_workers >= 3" in text
    assert "3 render processes are enough to feed the fastest, the encoder + VQ alone" in text
    fine = bench_codebook.interpret(_result(render_s=0.05, encode_s=0.2, train_s=10.0, workers=2))
    assert fine.startswith("rendering keeps up") and "2 grain worker processes" in fine and ">=" not in fine
    assert "at 100% of its rate" in fine and "rendering overlaps the step" in fine
    slow = bench_codebook.interpret(_result(render_s=0.05, encode_s=0.2, train_s=10.0, live_s=12.5))
    assert "at 80% of its rate" in slow and "costs the step its CPU time" in slow


def test_bad_arguments_are_rejected(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--only", "codebook", "--codebook-examples", "-1"])
    assert "--codebook-examples must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--only", "codebook", "--codebook-phases", "render,live"])
    assert "needs render and at least one of encode,train_alpha,train" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--only", "codebook", "--codebook-phases", "render,encode,live"])
    assert "live needs train" in capsys.readouterr().err
    with pytest.raises(ValueError, match="name:split"):
        bench_codebook.load_corpus("gsm8k_aug")


def test_make_bench_skips_it_without_benchmark_data_but_only_codebook_fails(tmp_path, capsys, monkeypatch):
    """`make bench` on a machine without ../shared/data: the section is skipped, saying why, and the other
    sections run; asking for it alone is an error naming the data."""
    monkeypatch.setenv("DLR_DATA_DIR", str(tmp_path / "no_data"))
    ran = []
    monkeypatch.setattr(cli, "BENCHMARKS", ("codebook",))  # nothing else: the test runs no benchmark
    monkeypatch.setattr(bench_codebook, "run_section", lambda *a, **k: ran.append(1) or "x")
    cli.main(["--out", str(tmp_path / "B.md")])
    out = capsys.readouterr().out
    assert "codebook: skipped (--codebook-corpus gsm8k_aug:valid needs the benchmark data" in out and not ran
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "B.md"), "--only", "codebook"])
    assert "DLR_DATA_DIR" in capsys.readouterr().err and not ran
    # a bad argument stays an error without --only; a synthetic corpus needs no data; a data root without
    # the benchmark's file is named
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "B.md"), "--codebook-phases", "render,live"])
    assert "needs render and at least one of" in capsys.readouterr().err and not ran
    ns = argparse.Namespace(codebook_corpus="synthetic_hard:train")
    assert bench_codebook.missing_inputs(ns) is None
    (tmp_path / "no_data").mkdir()
    assert "gsm8k_aug" in bench_codebook.missing_inputs(argparse.Namespace(codebook_corpus="gsm8k_aug:valid"))
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "B.md"), "--only", "codebook", "--codebook-corpus", "gsm9k:valid"])
    assert "unknown benchmark 'gsm9k'" in capsys.readouterr().err


def test_the_corpus_is_what_the_codebook_renders(data_dir):  # reads gsm8k_aug:valid
    from dlr_jax.data.cot_view import step_results
    whole = bench_codebook.load_corpus("gsm8k_aug:valid", 3)
    results = bench_codebook.load_corpus("gsm8k_aug:valid", 3, view="results")
    assert len(results) == len(whole) == 3
    assert results == [" ".join(step_results(c)) for c in whole] and results != whole
