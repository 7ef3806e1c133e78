"""The planner's packed totals: the configured data's lengths measured once (cached), packed as the pipeline
packs them, the stage's steps and FLOPs padded and packed side by side."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from dlr_jax.config import load_config
from dlr_jax.data.items import fitting_items
from dlr_jax.data.latents import default_num_latents
from dlr_jax.data.render_pipeline import canvas_side, render_config
from dlr_jax.data.sources import load_examples
from dlr_jax.plan import cli as plan
from dlr_jax.plan import lengths as L
from dlr_jax.plan import totals

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
DATA = ["data.synthetic_train=300", "train.sft.num_epochs=2", "train.align.num_epochs=2"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DLR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_measured_once_then_read_from_the_cache(tmp_path, monkeypatch, cache):
    cfg = load_config(TINY, [*DATA, f"run.workdir={tmp_path / 'w'}"])
    first = L.stage_lengths(cfg, "sft")
    assert not first.cached and first.population == 300 and len(first.lengths) == 300
    assert Path(first.path).parent == cache / "lengths"
    # the lengths are the pipeline's: the run's tokenizer (a BPE trained as get_tokenizer trains it) and latents
    from dlr_jax.stages.common import get_tokenizer
    from dlr_jax.stages.latent_common import latents_for

    examples = load_examples(cfg, "train")
    tok = get_tokenizer(cfg, tmp_path / "t", examples)  # (not in the workdir: there the plan would read it)
    table = latents_for(cfg, tmp_path, "train", examples)
    _, want, _ = fitting_items("sft", examples, tok, max_len=10_000, latents=table)
    assert sorted(first.lengths) == sorted(want)

    def measured_again(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(L, "measure", measured_again)
    again = L.stage_lengths(cfg, "sft")
    assert again.cached and again.lengths == first.lengths
    # how rows are filled does not change the sequences: same cache entry
    assert L.stage_lengths(load_config(TINY, [*DATA, f"run.workdir={tmp_path / 'w'}", "data.pack=true"]), "sft").cached
    with pytest.raises(AssertionError, match="measured again"):  # other data: measured anew
        L.stage_lengths(load_config(TINY, ["data.synthetic_train=301"]), "sft")


def test_a_latent_curriculum_plans_each_example_at_its_longest_row(tmp_path):
    from dlr_jax.data.curriculum import Curriculum
    from dlr_jax.stages.common import get_tokenizer
    from dlr_jax.stages.latent_common import latents_for

    cfg = load_config(TINY, [*DATA, f"run.workdir={tmp_path / 'w'}", "latent.curriculum=random"])
    planned = L.stage_lengths(cfg, "sft")
    examples = load_examples(cfg, "train")
    tok = get_tokenizer(cfg, tmp_path / "t", examples)
    table = latents_for(cfg, tmp_path, "train", examples)
    _, want, _ = fitting_items("sft", examples, tok, max_len=10_000, latents=table, curriculum=Curriculum("random"))
    assert sorted(planned.lengths) == sorted(want)  # one step a span: the text CoT or the paper's row
    assert sum(planned.lengths) > sum(L.stage_lengths(load_config(TINY, [*DATA]), "sft").lengths)


def test_codebook_latents_are_estimated_from_the_canvas_without_exported_ids(tmp_path):
    cfg = load_config(TINY, [*DATA, "latent.source=codebook", f"run.workdir={tmp_path}"])
    lengths = L.stage_lengths(cfg, "align")
    assert any("canvas" in n for n in lengths.notes)
    # the same sequences with the random stand-in's 4 or 9 latents: the difference is the estimated count
    random = L.stage_lengths(load_config(TINY, [*DATA, f"run.workdir={tmp_path}"]), "align")
    examples = load_examples(cfg, "train")
    est = [a - b + default_num_latents(ex) for a, b, ex in zip(lengths.lengths, random.lengths, examples, strict=True)]
    side = canvas_side(examples[0].cot, 18, render_config(cfg.codebook))[0]  # tiny.yaml's mean font, rounded
    assert est[0] == (side // 64) ** 2 and set(est) <= {1, 4, 9, 16}


def test_a_step_codebook_estimates_a_canvas_a_step(tmp_path):
    from dlr_jax.text.steps import split_steps

    chain = L.stage_lengths(load_config(TINY, [*DATA, "latent.source=codebook", f"run.workdir={tmp_path}"]), "align")
    cfg = load_config(TINY, [*DATA, "latent.source=codebook", "codebook.render_unit=step", f"run.workdir={tmp_path}"])
    step = L.stage_lengths(cfg, "align")
    rcfg, n = render_config(cfg.codebook), lambda text: (canvas_side(text, 18, rcfg)[0] // 64) ** 2
    for a, b, ex in zip(step.lengths, chain.lengths, load_examples(cfg, "train"), strict=True):
        assert a - b == sum(n(s) for s in split_steps(ex.cot)) - n(ex.cot)
    assert step.lengths != chain.lengths


def test_a_stand_in_split_is_named_in_the_notes(tmp_path):
    """Without GSM8K-Aug's full train file the readers read the 3,000-line subset in its place, and the lengths say
    so (the totals scale its rows to the full split's count). A data folder holding only the subset: the shared data's
    own state does not matter."""
    lines = [f"What is {a} plus {a + 1}?||<<{a}+{a + 1}={2 * a + 1}>> #### {2 * a + 1}" for a in range(150)]
    (tmp_path / "train_subset_3000.txt").write_text("\n".join(lines) + "\n")
    cfg = load_config(TINY, ["data.dataset=gsm8k_aug", "data.rl_split=0", f"data.path={tmp_path}"])
    with pytest.warns(UserWarning, match="using the 3,000-line subset"):
        lengths = L.stage_lengths(cfg, "textsft", sample=100)
    assert "read from gsm8k_aug:train_subset_3000, standing in for train" in lengths.notes[0]
    assert lengths.population == 150 and len(lengths.lengths) == 100


def test_stage_totals_padded_and_packed_side_by_side():
    cfg = load_config(TINY, DATA)
    lengths = L.Lengths("sft", tuple([40] * 150 + [90] * 150), 300, ("by hand",), "-", False)
    prog = types.SimpleNamespace(steps_per_epoch_examples=cfg.train.sft.batch_size)
    r = totals.stage_total_flops(cfg, "sft", 1.0, prog, lengths)
    assert r["stage_examples"] == 300 and r["stage_steps"] == -(-2 * 300 // cfg.train.sft.batch_size)
    assert r["examples_per_row"] > 1.2 and r["packed_efficiency"] > r["padded_efficiency"]
    assert r["stage_steps_packed"] < r["stage_steps"]
    assert r["stage_total_flops_packed"] == r["stage_steps_packed"] and r["length_max"] == 90
    # a recipe counted in steps runs as many steps packed
    fixed = load_config(TINY, ["data.synthetic_train=300"])
    r = totals.stage_total_flops(fixed, "sft", 1.0, prog, lengths)
    assert r["stage_steps_packed"] == r["stage_steps"]
    assert "stage_steps_packed" not in totals.stage_total_flops(cfg, "sft", 1.0, prog)


def test_missing_data_leaves_packed_totals_out_with_a_note(tmp_path):
    cfg = load_config(TINY, ["data.dataset=gsm8k_aug", f"data.path={tmp_path / 'nowhere.txt'}"])
    lengths, why = plan.measured_lengths(cfg, "sft")
    assert lengths is None and "packed totals left out" in why
    assert plan.measured_lengths(cfg, "rl") == (None, None)


def test_cli_prints_both(capsys):
    small = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
             "model.num_kv_heads=1", "model.head_dim=16", "latent.num_latents=64", "latent.latent_dim=16"]
    argv = ["--config", str(TINY), "--stage", "align", "--device", "cpu", "--mesh", "data=1,fsdp=1,tensor=1"]
    for s in [*DATA, *small]:
        argv += ["--set", s]
    assert plan.main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["stage_steps_packed"] < r["stage_steps"] and r["lengths_measured"] == 300
    assert plan.main(argv) == 0
    text = capsys.readouterr().out
    assert "packed rows:" in text and "in padded rows" in text and "measured lengths" in text


def test_packed_totals_of_the_dual_branch_count_its_ocr_slots():
    """sft's dual branch on packed rows: a row computes S = ocr_slots OCR rows (max_len 64 // the shortest
    sequence 20 = 3), unused slots included, so a packed step costs more than a padded one, by (S - 1) rows of OCR
    branch; the packed totals count that step, not the padded one."""
    from dlr_jax.plan.programs import build_program
    from dlr_jax.plan.targets import TARGETS, target_mesh

    small = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
             "model.num_kv_heads=1", "model.head_dim=16", "latent.num_latents=64", "latent.latent_dim=16",
             "codebook.dec_layers=1", "data.max_len=64", "train.sft.batch_size=4"]
    cfg = load_config(TINY, [*DATA, *small, "latent.dual_branch=on", "latent.source=codebook", "data.pack=true"])
    lengths = L.Lengths("sft", tuple([20] * 100 + [40] * 200), 300, ("by hand",), "-", False)
    one = {"data": 1, "fsdp": 1, "tensor": 1}
    r = plan.plan_once(cfg, "sft", TARGETS["cpu"], one, lengths)
    mesh = target_mesh(TARGETS["cpu"], one)
    padded, packed = r["flops_per_step"], r["flops_per_step_packed"]
    assert r["ocr_slots"] == 3 and padded == totals.step_flops(cfg, "sft", mesh)  # counted the same way
    one, two = (totals.step_flops(cfg, "sft", mesh, ocr_slots=s) for s in (1, 2))
    # one slot is the padded step but for the batch's slot fields (ocr_segment_ids, the trainer's batch hash)
    assert one == pytest.approx(padded, rel=1e-5)
    # every slot adds the same OCR rows' work: the packed step is (S - 1) slots' more than one slot's ...
    assert packed - one == 2 * (two - one) and two - one > 1e-3 * padded
    # ... each the branch's work on a row, less than all the branch adds to a padded step (its update too)
    no_branch = totals.step_flops(load_config(TINY, [*DATA, *small, "latent.dual_branch=off"]), "sft", mesh)
    assert two - one < padded - no_branch
    assert r["stage_total_flops_packed"] == r["stage_steps_packed"] * packed
    assert r["stage_steps_packed"] < r["stage_steps"]
    assert "3 OCR rows" in r["notes_packed"] and "padded rows only" not in r["notes_packed"]
    assert any("planned at one OCR row a token row" in n for n in r["notes"])  # the compiled step: padded layout
    assert "steps of" in plan.format_plan(r) and "(3 OCR rows a row)" in plan.format_plan(r)
    # the packed program's batch: the OCR fields and the slots' segment ids per slot, as the pipeline feeds them
    batch = build_program(cfg, "sft", mesh, ocr_slots=3).args[3]
    assert batch["ocr_targets"].shape == (1, 4, 3, cfg.codebook.max_text_len)
    assert batch["ocr_codes"].shape[:3] == batch["ocr_code_mask"].shape[:3] == (1, 4, 3)
    assert batch["ocr_segment_ids"].shape == (1, 4, 3)
    assert "ocr_segment_ids" not in build_program(cfg, "sft", mesh).args[3]
