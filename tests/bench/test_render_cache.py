"""The render-cache benchmark: a micro run through the CLI writes a sane section (the cache's first batch is
checked against rendering inside it); the 1024 case really draws 1024-px canvases. No timing thresholds."""

from __future__ import annotations

import math
import re

import pytest

from dlr_jax.bench import cli
from dlr_jax.bench import render_cache as bench_render_cache
from dlr_jax.config import load_config
from dlr_jax.data import render_pipeline as rp


def test_cli_writes_the_section(tmp_path):
    out = tmp_path / "B.md"
    out.write_text("# Benchmarks\n\n<!-- bench:train -->\nold train\n<!-- /bench:train -->\n")
    cli.main(["--out", str(out), "--only", "render_cache", "--repeats", "1", "--render-cache-corpus",
                "synthetic:test", "--render-cache-examples", "64", "--render-cache-cases", "tiny",
                "--render-cache-workers", "1"])
    text = out.read_text()
    assert "old train" in text
    body = text.split("<!-- bench:render_cache -->\n", 1)[1].split("<!-- /bench:render_cache -->", 1)[0]
    assert body.startswith("## Render cache") and "load average at start" in body and "at the end" in body
    (row,) = [line for line in body.splitlines() if line.startswith("| tiny |")]
    cells = row.split(" | ")
    assert cells[1] == "128 (64)" and cells[2] == "64 (batch 32)"
    nums = [float(re.sub(r"[,x]", "", c.strip(" |"))) for c in cells[3:]]
    assert all(math.isfinite(x) and x > 0 for x in nums)
    fly1, cache1, ratio1, flyall, cacheall, ratio_all = nums[1:7]
    assert ratio1 == pytest.approx(cache1 / fly1, abs=0.051 + 0.01 * ratio1)  # printed to 0.1, rates rounded
    assert ratio_all == pytest.approx(cacheall / flyall, abs=0.051 + 0.01 * ratio_all)
    assert "Interpretation: at tiny the cache is" in body


def test_the_1024_case_fills_1024_px_canvases():
    cfg = load_config(bench_render_cache.TINY)
    cots = [f"Tom has {i} apples and buys {i + 3} more, so he has {2 * i + 3} apples." for i in range(40)]
    texts, rcfg, batch = bench_render_cache.case_setup("1024", cots, cfg)
    assert len(texts) >= bench_render_cache.MIN_1024 and batch == 8
    assert all(len(t) >= bench_render_cache.FILL_CHARS for t in texts)
    for t in texts[:3]:
        side, shrunk, truncated = rp.canvas_side(t, round(rcfg.font_mean), rcfg)
        assert side == 1024 and not truncated
    with pytest.raises(SystemExit):
        cli.main(["--only", "render_cache", "--render-cache-cases", "tiny,2048"])
