"""`make bench-gpu`'s script: its dry run executes the GPU benchmark's whole code path on the CPU at a toy size."""

from __future__ import annotations

import numpy as np
import pytest

from dlr_jax.bench import gpu
from dlr_jax.bench.gpu_side import segments_as_rows


def test_packed_batch_is_the_pipeline_s_layout():
    case = gpu.CASES["toy"]
    b = gpu.packed_batch(case)
    assert set(b) == {"tokens", "loss_mask", "segment_ids", "positions"}
    assert all(v.shape == (case.batch, case.seq) and v.dtype == np.int32 for v in b.values())
    for r in range(case.batch):
        seg = b["segment_ids"][r]
        assert seg.max() > 2 and (np.diff(seg[seg > 0]) >= 0).all()
        for s in range(1, seg.max() + 1):
            m = seg == s
            np.testing.assert_array_equal(b["positions"][r][m], np.arange(m.sum()))
            assert b["loss_mask"][r][m][0] == 0 and b["loss_mask"][r][m][-1] == 1  # prompt first, then targets
        assert (b["loss_mask"][r][seg == 0] == 0).all()
    rows = segments_as_rows(b, 0)
    assert rows["tokens"].shape[0] == b["segment_ids"][0].max()
    assert int(rows["segment_ids"].sum()) == int((b["segment_ids"][0] > 0).sum())


def test_the_real_run_needs_a_gpu(capsys):
    with pytest.raises(SystemExit) as e:
        gpu.main([])
    assert e.value.code == 2 and "not a GPU" in capsys.readouterr().err


def test_dry_run_writes_the_section(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n<!-- bench:gpu -->\nstale text\n<!-- /bench:gpu -->\n\nafter\n")
    assert gpu.main(["--dry-run", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.endswith("<!-- /bench:gpu -->\n\nafter\n") and "stale text" not in text
    assert "DRY RUN" in text and "| tokens/s (all row tokens; median) |" in text
    assert "speed-up of ours" in text  # both sides ran
    assert "The planner on this compiled step" in text and "FLOPs a step counted" in text
    assert "| rollout (sampling) |" in text and "| update (mu optimizer steps) |" in text
    packed, apart = (float(x) for x in text.split("first row's loss packed ")[1].split(" (bf16")[0]
                     .replace(", its segments one a row", "").split())
    assert packed == pytest.approx(apart, rel=2e-2)  # transformers' packed rows attend within segments
