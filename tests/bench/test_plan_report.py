"""The plan table: one row per plan, the rollout's decoding layout beside the training mesh, failed
compiles kept as rows."""

from __future__ import annotations

from dlr_jax.bench.plan_report import GiB, table

ROW = {"config": "llama3.1-8b", "stage": "rollout", "device": "h100", "mesh": {"data": 1, "fsdp": 8, "tensor": 1},
       "run_mesh": {"data": 1, "fsdp": 1, "tensor": 8}, "remat": "full", "peak_bytes": 3.4 * GiB,
       "hbm_bytes": 80 * GiB, "fits": True, "flops_per_step": 2.46e14, "roofline_step_s": 2.763,
       "roofline_bound": "memory", "roofline_mfu": 0.01, "stage_total_flops": 1.05e19, "paper_total_flops": 1.365e18}


def test_rows_show_where_the_rollout_decodes_and_failures_stay_visible():
    sft = {k: v for k, v in ROW.items() if k != "run_mesh"} | {"stage": "sft"}
    failed = {"config": "qwen3-4b", "stage": "rl", "device": "tpu-v5p", "error": "CompileTimeHbmOom: 123 GiB"}
    text = table([ROW, sft, failed], command="cmd", machine="here")
    rows = [line for line in text.splitlines() if line.startswith("| llama") or line.startswith("| qwen")]
    assert rows[0].startswith("| llama3.1-8b | rollout | h100 | 1,8,1 (decodes on 1,1,8) | full | 3.4 / 80 GiB | yes")
    assert "2763 ms (memory)" in rows[0] and "10,500 P (1,365 P)" in rows[0]
    assert "| 1,8,1 |" in rows[1]  # a training step runs on the training mesh
    assert "error: CompileTimeHbmOom" in rows[2]
    assert "Command: `cmd` (here)" in text


def test_rows_of_another_run_name_their_own_command():
    # the TPU rows compile in libtpu's own environment and another config's rows with other stages: one table,
    # each run's command and machine beside the rows it made
    ocr2 = ROW | {"config": "qwen3-4b-ocr2", "stage": "codebook", "command": "cmd2 --set x=1", "machine": "there"}
    text = table([ROW, ocr2, ocr2 | {"device": "tpu-v5p", "command": "cmd3", "machine": "tpu venv"}],
                 command="cmd", machine="here")
    assert "Command: `cmd` (here); rows of qwen3-4b-ocr2: `cmd2 --set x=1` (there); rows of qwen3-4b-ocr2: " \
           "`cmd3` (tpu venv). Memory" in text
    assert table([ocr2], command="cmd", machine="here").count("`cmd2 --set x=1` (there). Memory") == 1
