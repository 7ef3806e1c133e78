"""The plan table: one row per plan, the rollout's decoding layout beside the training mesh, failed
compiles kept as rows; the stages with packed totals in a second table, padded and packed side by side."""

from __future__ import annotations

from dlr_jax.bench.plan_report import GiB, packed_table, table

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


PACKED = {k: v for k, v in ROW.items() if k != "run_mesh"} | {
          "config": "qwen3-4b", "stage": "sft", "device": "h100", "flops_per_step": 4.84e14, "stage_steps": 14_063,
          "stage_total_flops": 6.807e18, "paper_total_flops": 3.25e17, "stage_steps_packed": 3_516,
          "flops_per_step_packed": 5.0e14, "ocr_slots": 8, "stage_total_flops_packed": 1.758e18,
          "examples_per_row": 4.0, "length_mean": 59.6, "length_p95": 87.0, "length_max": 145,
          "stage_roofline_s": 14_063 * 0.43, "stage_roofline_s_packed": 3_516 * 0.5,
          "lengths_notes": ["sft sequences of 3,000 examples", "latent counts estimated"]}


def test_packed_totals_sit_beside_the_padded_ones():
    align = {k: v for k, v in PACKED.items() if k not in ("flops_per_step_packed", "ocr_slots", "paper_total_flops",
                                                        "stage_roofline_s_packed")} | {"stage": "align"}
    text = table([ROW, PACKED, align], command="cmd", machine="here")
    assert packed_table([ROW]) == ""  # no plan with packed totals: no second table
    assert "### Padded vs packed rows" in text
    rows = [line for line in text.split("### Padded vs packed")[1].splitlines() if line.startswith("| qwen3-4b |")]
    assert rows[0] == ("| qwen3-4b | sft | h100 | 60 / 87 / 145 | 4.00 | 14,063 / 3,516 | 4.84e+14 / 5e+14 (8 OCR rows "
                       "a row) | 6,807 P (325 P) | 1,758 P | 0.26 | 101 min | 29 min |")
    # a packed step as the padded one; a time that is not known stays a dash
    assert "| 4.84e+14 / 4.84e+14 |" in rows[1] and rows[1].endswith("| 101 min | — |")
    assert "Lengths of qwen3-4b sft, qwen3-4b align: sft sequences of 3,000 examples; latent counts estimated." in text
