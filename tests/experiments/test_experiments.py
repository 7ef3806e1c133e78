"""The experiment runner: p-values against hand-computed cases, planning (variants, shared stages,
commands for tiny and a real-backbone config, nothing written by --dry-run), running with skip /
resume / failure reporting on stand-in commands, the report (table, gap, cost, plots) from results
files, and one slow end-to-end `main --seeds 1` on a micro config."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlr_jax.config import dump_config, load_config
from dlr_jax.experiments import main as cli_main
from dlr_jax.experiments import plots, report, runner, tables
from dlr_jax.experiments.baselines import (
    DIRECT_FROM_COT,
    MATCHED_COT,
    MATCHED_DIRECT,
    direct_from_cot_variant,
    matched_budget,
)
from dlr_jax.experiments.plan import experiment, k_values
from dlr_jax.experiments.rendering import half_font_overrides, larger_canvas_overrides
from dlr_jax.experiments.runner import Step
from dlr_jax.experiments.stats import betainc, paired_t_test, t_two_sided_p
from dlr_jax.experiments.variants import Method

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")

# ---------------------------------------------------------------------------------------------
# Statistics.


def test_paired_t_test_matches_a_hand_computed_case():
    # d = [0.1, 0.15, 0.05]: mean 0.1, sd 0.05, t = 0.1 / (0.05 / sqrt 3) = 2 sqrt 3, df = 2.
    # For df = 2 the t CDF is 1/2 + t / (2 sqrt(2 + t^2)), so p = 1 - t / sqrt(2 + t^2) = 1 - sqrt(12/14).
    a, b = [0.5, 0.6, 0.7], [0.4, 0.45, 0.65]
    t, p = paired_t_test(a, b, use_scipy=False)
    assert t == pytest.approx(2 * math.sqrt(3))
    assert p == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-10)  # 0.07418...
    try:
        import scipy  # noqa: F401
    except ImportError:
        print("scipy not installed: only the written-out t distribution is checked")
        return
    t2, p2 = paired_t_test(a, b, use_scipy=True)
    assert (t2, p2) == pytest.approx((t, p), rel=1e-9)


def test_t_distribution_closed_forms():
    # df = 1 is the Cauchy distribution: p = 1 - (2 / pi) atan |t|.
    for t in (0.3, 1.0, 4.0, 30.0):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-10)
        assert t_two_sided_p(-t, 1) == t_two_sided_p(t, 1)
    # df = 4 goes through I_x(2, 1/2), which integrates in closed form to 1 - (1 + x/2) sqrt(1 - x).
    for x in (0.1, 0.5, 0.9):
        assert betainc(2.0, 0.5, x) == pytest.approx(1 - (1 + x / 2) * math.sqrt(1 - x), rel=1e-10)
    assert t_two_sided_p(0.0, 5) == pytest.approx(1.0) and t_two_sided_p(math.inf, 5) == 0.0


def test_degenerate_pairs():
    assert all(math.isnan(v) for v in paired_t_test([0.5], [0.4]))  # one seed: no test
    assert all(math.isnan(v) for v in paired_t_test([0.5, 0.6], [0.5, 0.6]))  # all differences 0
    t, p = paired_t_test([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])  # all differ by exactly 0.1 (in binary: almost)
    assert p < 1e-6 and t > 0
    assert paired_t_test([1.0, 2.0], [0.0, 1.0]) == (math.inf, 0.0)
    with pytest.raises(ValueError, match="equal lengths"):
        paired_t_test([1.0, 2.0], [1.0])


# ---------------------------------------------------------------------------------------------
# Planning.


def _tiny(*extra: str):
    return load_config(TINY, ["latent.source=codebook", *extra])


def test_main_plan_and_the_ablations_share_stages():
    cfg = _tiny()
    main = experiment("main", cfg)
    assert [m.label for m in main.methods] == ["Direct-SFT", "CoT-SFT", "DLR-SFT", "DLR-Full"]
    assert main.variants[0].runs == ("textsft", "codebook", "export", "align", "sft", "rl")
    ab = experiment("ablations", cfg)
    v = {x.name: x for x in ab.variants}
    assert set(v) == {"main", "no_align", "no_sft", "no_process_reward", "k128", "k256", "k1024", "k2048", "half_font"}
    assert v["no_process_reward"].runs == ("rl",) and "sft" in v["no_process_reward"].reuse
    assert v["no_align"].runs == ("align", "sft", "rl") and "train.align.learning_rate=0.0" in v["no_align"].overrides
    assert v["k128"].reuse == ("textsft",) and not v["k128"].link_tokenizer  # the tokenizer holds K ids
    labels = [m.label for m in ab.methods]
    assert labels[0] == "DLR-Full" and len(labels) == len(set(labels))
    assert [m.force_latents for m in ab.methods if m.group == "forced_stop"] == [2, 4, 6, 8]
    assert sorted(m.x for m in ab.methods if m.group == "k_sweep") == [128, 256, 512, 1024, 2048]
    # random latent ids: no codebook stages, and no half-font experiment (it changes the rendering)
    rnd = load_config(TINY, ["latent.source=random"])
    assert experiment("main", rnd).variants[0].runs == ("textsft", "align", "sft", "rl")
    with pytest.raises(ValueError, match="latent.source=codebook"):
        experiment("half_font", rnd)
    quiet = experiment("ablations", rnd)  # the table still runs, and says what it left out
    assert "half_font" not in {x.name for x in quiet.variants}
    assert "except half font (latent.source=random" in quiet.description and "except" not in ab.description
    with pytest.raises(ValueError, match="unknown experiment"):
        experiment("nope", cfg)


def test_half_font_and_k_values_follow_the_config():
    tiny = _tiny()  # fixed 128-px canvas: the side halves with the font (N 4 -> 1)
    assert half_font_overrides(tiny) == ("codebook.font_mean=8.75", "codebook.font_std=0.75", "codebook.font_min=8",
                                         "codebook.font_max=10", "codebook.min_side=64", "codebook.max_side=64")
    real = load_config(ROOT / "configs" / "qwen3-4b.yaml")  # canvas sized to the text: fonts only
    assert all("side" not in o for o in half_font_overrides(real))
    assert k_values(real, None) == (2500, 5000, 10000, 20000, 40000)  # the paper's grid
    assert k_values(tiny, [64, 256]) == (64, 256, 512)  # the config's K is always a point


def test_levers_change_one_thing_of_main_each_and_train_from_the_first_stage_it_affects():
    cfg = _tiny()
    exp = experiment("levers", cfg)
    assert exp.full == "DLR-SFT"
    v = {x.name: x for x in exp.variants}
    assert list(v) == ["main", "align_x4", "dual_off", "dual_x4", "dc_x4", "canvas", "rl_lr_div10", "wide", "deep"]
    assert v["rl_lr_div10"].runs == ("rl",) and v["rl_lr_div10"].reuse == ("textsft", "codebook", "export", "align",
                                                                           "sft")
    assert v["rl_lr_div10"].overrides == (f"train.rl.learning_rate={cfg.train.rl.learning_rate / 10:g}",)
    assert v["align_x4"].overrides == ("train.align.num_steps=400",) and v["align_x4"].runs == ("align", "sft")
    assert v["align_x4"].reuse == ("textsft", "codebook", "export")
    assert v["dual_off"].runs == v["dual_x4"].runs == ("sft",) and "align" in v["dual_x4"].reuse
    assert v["dual_x4"].overrides == ("latent.dual_branch_weight=4",)
    assert v["dc_x4"].overrides == ("latent.latent_dim=256",) and v["dc_x4"].runs[0] == "codebook"
    assert v["canvas"].overrides == ("codebook.min_side=192", "codebook.max_side=192")  # N = 4 -> 9
    assert v["wide"].runs == ("textsft", "align", "sft") and v["wide"].reuse == ("codebook", "export")
    assert "model.hidden_size=256" in v["wide"].overrides and v["deep"].overrides == ("model.num_layers=4",)
    for x in exp.variants:  # every lever is a config the stages accept
        load_config(TINY, ["latent.source=codebook", *x.overrides])
    rows = {m.label: m for m in exp.methods}
    assert rows["DLR-SFT, width x2 (hidden 256)"].baselines == ("Direct-SFT, width x2 (hidden 256)",
                                                                  "CoT-SFT, width x2 (hidden 256)")
    dc = rows["d_c x4 (256 and the flow)"]  # flow_hidden 0: the flow is d_c wide
    assert dc.baselines == ("Direct-SFT", "CoT-SFT") and dc.stage == "sft"
    assert rows["DLR-Full (RL on top)"].variant == "main" and rows["DLR-Full (RL on top)"].stage == "rl"
    steps = runner.build_steps(exp, root=Path("/w"), config=TINY, overrides=[], seeds=[0])
    wide = [(st.kind, st.stage) for st in steps if st.variant == "wide"]
    assert wide == [("train", "textsft"), ("train", "align"), ("train", "sft"), ("evaluate", "textsft_direct"),
                    ("evaluate", "textsft_cot"), ("evaluate", "sft")]
    # no image without the codebook: no dual branch or canvas levers; a fixed backbone: no width / depth
    rnd = {x.name for x in experiment("levers", load_config(TINY, ["latent.source=random"])).variants}
    assert rnd == {"main", "align_x4", "dc_x4", "rl_lr_div10", "wide", "deep"}
    real = load_config(ROOT / "configs" / "qwen3-4b.yaml", ["init_from=/weights/qwen3-4b"])
    rv = {x.name: x for x in experiment("levers", real).variants}
    assert "wide" not in rv and "deep" not in rv
    align = real.train.align
    want = f"train.align.num_epochs={align.num_epochs * 4!r}" if align.num_epochs else \
        f"train.align.num_steps={align.num_steps * 4}"
    assert rv["align_x4"].overrides == (want,)
    assert all("font" in o for o in larger_canvas_overrides(real))  # a canvas sized to the text: larger glyphs
    # a pretrained DeepSeek-OCR-2 codebook fixes d_c and N and has no dual branch; a query table too small
    # for the larger canvas drops that lever (the stage would refuse it after main had trained)
    ocr2 = load_config(ROOT / "configs" / "codebook-ocr2.yaml", ["codebook.init_from=/weights/ocr2"])
    assert {x.name for x in experiment("levers", ocr2).variants} == {"main", "align_x4", "rl_lr_div10", "wide", "deep"}
    few = {x.name for x in experiment("levers", _tiny("codebook.num_queries=4")).variants}
    assert "canvas" not in few and "dc_x4" in few


def test_report_measures_a_backbone_lever_against_its_own_baselines(tmp_path):
    exp = experiment("levers", _tiny())
    wide = "width x2 (hidden 256)"
    acc = {"Direct-SFT": [0.10, 0.20], "CoT-SFT": [0.50, 0.60], "DLR-SFT": [0.30, 0.30],
           f"Direct-SFT, {wide}": [0.20, 0.20], f"CoT-SFT, {wide}": [0.70, 0.80], f"DLR-SFT, {wide}": [0.45, 0.50]}
    for s in range(2):
        for m in exp.methods:
            if m.label in acc:
                _results(tmp_path, s, m, acc[m.label][s], 4.0, 10.0, 0.002)
    res = report.build(exp, root=tmp_path, seeds=[0, 1], command="cmd", config=TINY, overrides=[], steps_done=1,
                       steps_total=2)
    gaps = res["gap_closed"]["synthetic"]
    assert gaps["DLR-SFT"]["per_seed"] == pytest.approx([0.5, 0.25])
    assert gaps[f"DLR-SFT, {wide}"]["per_seed"] == pytest.approx([0.25 / 0.5, 0.30 / 0.6])  # its own baselines
    assert f"Direct-SFT, {wide}" not in gaps and "d_c x4 (256 and the flow)" not in gaps  # baseline; no results
    table = res["summary"]["synthetic"]
    assert table[f"DLR-SFT, {wide}"]["p_vs_full"] == pytest.approx(
        paired_t_test(acc[f"DLR-SFT, {wide}"], acc["DLR-SFT"])[1])
    cost = {c["vs"]: c for c in res["cost"]["synthetic"]}  # latent rows only, each against its own CoT-SFT
    assert set(cost) == {"DLR-SFT", f"DLR-SFT, {wide}"}
    md = tables.markdown(res)
    assert f"DLR-SFT, {wide} 50 ± 0 % (of its own baselines' gap, Direct-SFT, {wide} → CoT-SFT, {wide})" in md


def test_matched_baselines_train_the_text_sfts_on_dlr_sft_s_budget(tmp_path):
    # tiny: DLR-SFT's model trained 800 CoT-SFT + 100 align + 400 SFT steps of 32 examples
    exp = experiment("main", _tiny(), matched=True)
    assert [m.label for m in exp.methods] == ["Direct-SFT", "CoT-SFT", MATCHED_DIRECT, MATCHED_COT, DIRECT_FROM_COT,
                                              "DLR-SFT", "DLR-Full"]
    # the control: Direct-SFT from the seed's CoT-SFT model for the align + SFT examples (100 + 400 steps of 32)
    ctl = exp.variants[2]
    assert (ctl.name, ctl.runs, ctl.reuse, ctl.textsft_mode) == ("direct_from_cot", ("textsft",), ("textsft",),
                                                                 "direct_from_cot")
    # ... at SFT's optimizer settings (tiny: 1e-3 against Direct-SFT's from-scratch 2e-3)
    assert ctl.overrides == ("train.textsft_direct.num_steps=500", "train.textsft_direct.num_epochs=0",
                             "train.textsft_direct.learning_rate=0.001")
    steps = runner.build_steps(exp, root=tmp_path, config=TINY, overrides=["train.textsft_direct.num_steps=2500"],
                               seeds=[0])
    (train,) = [s for s in steps if s.variant == "direct_from_cot" and s.kind == "train"]
    assert train.argv[train.argv.index("--mode") + 1] == "direct_from_cot"
    # the control's length wins over the experiment's --set for the main Direct-SFT (the last --set of a key wins)
    argv = list(train.argv)
    assert argv.index("train.textsft_direct.num_steps=500") > argv.index("train.textsft_direct.num_steps=2500")
    assert [f.parent.parent.name for f in train.done_files] == ["textsft_direct_from_cot"]
    assert tmp_path / "seed0/direct_from_cot/textsft_cot" in dict(train.links)  # the CoT-SFT model it starts from
    (ev,) = [s for s in steps if s.variant == "direct_from_cot" and s.kind == "evaluate"]
    assert ev.argv[ev.argv.index("--stage") + 1] == "textsft_direct_from_cot"
    # a recipe counted in epochs: align + SFT's epochs (the paper's 3 + 3)
    ctl, _ = direct_from_cot_variant(load_config(ROOT / "configs" / "qwen3-4b.yaml"))
    assert ctl.overrides[0] == "train.textsft_direct.num_epochs=6.0"
    # with init_from DLR-SFT starts from the checkpoint, not from CoT-SFT: no control
    real = load_config(ROOT / "configs" / "qwen3-4b.yaml", ["init_from=weights/qwen3-4b"])
    assert DIRECT_FROM_COT not in [m.label for m in experiment("main", real, matched=True).methods]
    v = exp.variants[1]
    assert (v.name, v.runs, v.reuse, v.link_tokenizer, v.textsft_mode) == ("matched", ("textsft",), (), True, "both")
    assert v.overrides == ("train.textsft.num_steps=1300", "train.textsft.num_epochs=0",
                           "train.textsft_direct.num_steps=1300", "train.textsft_direct.num_epochs=0")
    steps = runner.build_steps(exp, root=tmp_path, config=TINY, overrides=["latent.source=codebook"], seeds=[0])
    (train,) = [s for s in steps if s.variant == "matched" and s.kind == "train"]
    assert train.argv[train.argv.index("--mode") + 1] == "both" and "train.textsft.num_steps=1300" in train.argv
    assert dict(train.links) == {tmp_path / "seed0/matched/tokenizer": tmp_path / "seed0/main/tokenizer"}
    assert {f.parent.parent.name for f in train.done_files} == {"textsft_cot", "textsft_direct"}
    # examples, not steps: a larger SFT batch is a larger budget
    assert matched_budget(_tiny("train.sft.batch_size=64"))[0]["train.textsft.num_steps"] == 800 + 100 + 800
    # Direct-SFT already given the budget: its row reads main's, and only CoT-SFT is retrained
    exp = experiment("main", _tiny("train.textsft_direct.num_steps=1300"), matched=True)
    v = exp.variants[1]
    assert v.textsft_mode == "cot" and v.overrides == ("train.textsft.num_steps=1300", "train.textsft.num_epochs=0")
    assert next(m for m in exp.methods if m.label == MATCHED_DIRECT).variant == "main"
    steps = runner.build_steps(exp, root=tmp_path, config=TINY, overrides=[], seeds=[0])
    (train,) = [s for s in steps if s.variant == "matched" and s.kind == "train"]
    assert train.argv[train.argv.index("--mode") + 1] == "cot"
    assert [f.parent.parent.name for f in train.done_files] == ["textsft_cot"]
    assert len([s for s in steps if s.stage == "textsft_direct"]) == 1  # one evaluation backs both rows
    # the paper recipe counts epochs: 3 CoT-SFT + 3 align + 3 SFT; with init_from the text SFTs and the latent
    # stages all start from the checkpoint, so DLR-SFT's model trained align + SFT only
    real = ROOT / "configs" / "qwen3-4b.yaml"
    assert matched_budget(load_config(real))[0] == {"train.textsft.num_epochs": 9.0,
                                                    "train.textsft_direct.num_epochs": 9.0}
    assert matched_budget(load_config(real, ["init_from=weights/qwen3-4b"]))[0]["train.textsft.num_epochs"] == 6.0
    with pytest.raises(ValueError, match="one unit.*train.sft.num_steps=400"):
        matched_budget(_tiny("train.align.num_epochs=1"))
    with pytest.raises(ValueError, match="main experiment"):
        experiment("no_rl", _tiny(), matched=True)
    with pytest.raises(ValueError, match="data.pack_batch=exact or data.pack=false"):  # a row is several examples
        matched_budget(_tiny("data.pack=true"))
    # exact packed steps hold batch_size examples, as padded ones: the same budget
    assert matched_budget(_tiny("data.pack=true", "data.pack_batch=exact")) == matched_budget(_tiny())


def test_steps_link_from_main_and_skip_what_is_done(tmp_path):
    exp = experiment("no_process_reward", _tiny())
    steps = runner.build_steps(exp, root=tmp_path, config=TINY, overrides=["latent.source=codebook"], seeds=[0, 1])
    kinds = [(s.seed, s.variant, s.kind, s.stage) for s in steps]
    # each variant is evaluated as soon as it is trained: the table fills in during a long run
    assert kinds[:9] == [(0, "main", "train", st) for st in ("textsft", "codebook", "export", "align", "sft", "rl")] \
        + [(0, "main", "evaluate", "rl"), (0, "no_process_reward", "train", "rl"),
           (0, "no_process_reward", "evaluate", "rl")]
    assert kinds[9][0] == 1 and len(steps) == 18
    rl = steps[7]
    assert "--set" in rl.argv and "rl.process_weight=0.0" in rl.argv and "run.seed=0" in rl.argv
    assert rl.argv.index("rl.process_weight=0.0") > rl.argv.index("latent.source=codebook")  # the variant wins
    assert dict(rl.links)[tmp_path / "seed0/no_process_reward/sft"] == tmp_path / "seed0/main/sft"
    assert steps[0].argv[steps[0].argv.index("--mode") + 1] == "both"  # textsft trains CoT and Direct
    assert not any(s.is_done() for s in steps)
    for d in ("textsft_cot", "textsft_direct"):
        (tmp_path / "seed0/main" / d / "final").mkdir(parents=True)
        (tmp_path / "seed0/main" / d / "final/meta.json").write_text("{}")
    assert steps[0].is_done() and not steps[1].is_done()


def test_an_evaluation_missing_a_configured_benchmark_runs_again(tmp_path):
    """Adding benchmarks to eval.benchmarks (e.g. the synthetic task's out-of-domain variants) re-evaluates a
    finished run's models instead of skipping the evaluations whose results.json lacks them."""
    exp = experiment("no_rl", _tiny())
    plain = runner.build_steps(exp, root=tmp_path, config=TINY, overrides=[], seeds=[0])
    ood = ["eval.benchmarks=[synthetic,synthetic_hard,synthetic_reworded]"]
    wider = runner.build_steps(exp, root=tmp_path, config=TINY, overrides=ood, seeds=[0])
    ev, ev_wide = [st for st in plain if st.kind == "evaluate"][0], [st for st in wider if st.kind == "evaluate"][0]
    assert ev.benchmarks == ("synthetic",)
    assert ev_wide.benchmarks == ("synthetic", "synthetic_hard", "synthetic_reworded")
    assert ev_wide.argv[-2:] == ("--set", ood[0])  # the evaluation is told, not only the check
    assert ev.argv[ev.argv.index("--config") + 1] == TINY  # and reads the eval section the check reads
    [results] = ev.done_files
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps({"benchmarks": {"synthetic": {"n": 500}}}))
    assert ev.is_done() and not ev_wide.is_done()
    results.write_text(json.dumps({"benchmarks": {b: {"n": 500} for b in ev_wide.benchmarks}}))
    assert ev.is_done() and ev_wide.is_done()
    results.write_text("{not json")  # a half-written file is not a finished evaluation
    assert not ev_wide.is_done()
    assert all(not st.benchmarks for st in wider if st.kind == "train")


def test_no_share_of_a_gap_too_small_to_measure(tmp_path):
    """On a benchmark where CoT-SFT barely beats Direct-SFT (the out-of-domain analogues: 2-3 % for every
    method) a share of the gap is noise over noise (+100 ± 163 %): the report says so instead."""
    main = experiment("main", _tiny())
    acc = {"Direct-SFT": [0.020, 0.024], "CoT-SFT": [0.026, 0.030], "DLR-SFT": [0.030, 0.020],
           "DLR-Full": [0.022, 0.022]}
    for s in range(2):
        for m in main.methods:
            _results(tmp_path, s, m, acc[m.label][s], 4.0, 10.0, 0.002)
    res = report.build(main, root=tmp_path, seeds=[0, 1], command="cmd", config=TINY, overrides=[], steps_done=1,
                       steps_total=1)
    assert res["gap_closed"]["synthetic"]["DLR-SFT"] == {"too_small": True, "gap": pytest.approx(0.006)}
    md = tables.markdown(res)
    assert "Share of the Direct-SFT → CoT-SFT gap not reported for DLR-SFT, DLR-Full: the gap is 0.6 points" in md
    assert "gap closed" not in md


def test_recipe_hash_ignores_later_config_keys_at_their_defaults():
    """Runs recorded before data.synthetic_wording / synthetic_distractor_rate / synthetic_cot_style existed still
    merge with the same recipe run today; a recipe that sets them is another recipe."""
    import hashlib

    cfg = _tiny()
    before = "".join(line for line in dump_config(cfg).splitlines(keepends=True)
                     if not line.strip().startswith(("synthetic_wording:", "synthetic_distractor_rate:",
                                                     "synthetic_cot_style:", "gsm8k_cot:", "pack_batch:")))
    assert report.recipe_hash(cfg) == hashlib.sha256(before.encode()).hexdigest()[:16]
    assert report.recipe_hash(_tiny("data.synthetic_wording=varied")) != report.recipe_hash(cfg)
    assert report.recipe_hash(_tiny("data.synthetic_distractor_rate=0.5")) != report.recipe_hash(cfg)
    assert report.recipe_hash(_tiny("data.synthetic_cot_style=natural")) != report.recipe_hash(cfg)
    assert report.recipe_hash(_tiny("data.pack=true", "data.pack_batch=examples")) != report.recipe_hash(
        _tiny("data.pack=true"))
    # exact packed steps train the padded run's steps (tests/stages/test_packing.py): the padded recipe; and
    # pack_batch is read only when packing
    assert report.recipe_hash(_tiny("data.pack=true", "data.pack_batch=exact")) == report.recipe_hash(cfg)
    assert report.recipe_hash(_tiny("data.pack_batch=exact")) == report.recipe_hash(cfg)
    assert report.recipe_hash(_tiny("data.pack=true")) != report.recipe_hash(cfg)
    gsm8k = _tiny("data.dataset=gsm8k")
    assert report.recipe_hash(_tiny("data.dataset=gsm8k", "data.gsm8k_cot=raw")) != report.recipe_hash(gsm8k)


def test_dry_run_for_a_real_backbone_prints_commands_and_writes_nothing(tmp_path, capsys):
    w = tmp_path / "w"
    rc = cli_main(["ablations", "--config", str(ROOT / "configs/qwen3-4b.yaml"), "--workdir", str(w), "--seeds", "2",
                   "--set", "init_from=/weights/qwen3-4b", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and not w.exists()
    lines = [x for x in out.splitlines() if not x.startswith("#")]
    train = [x for x in lines if "dlr_jax.train" in x]
    assert all("configs/qwen3-4b.yaml" in x and "init_from=/weights/qwen3-4b" in x for x in train)
    assert all("dlr_jax.evaluate --workdir" in x for x in lines if x not in train)  # evaluate reads the workdir
    assert sum("--stage codebook" in x for x in lines) == 2 * 6  # main, K/4, K/2, 2K, 4K, half font per seed
    assert any("latent.num_latents=40000" in x for x in lines) and any("--force-latents 8" in x for x in lines)
    assert "seed1/no_align" in out and "(todo)" in out


def test_dry_run_needs_no_workdir_and_a_run_does(tmp_path, capsys, monkeypatch):
    """The paper tables' full-scale commands print from `--dry-run --config C` alone (W stands for the root);
    a real run without --workdir is refused, and nothing is written either way."""
    monkeypatch.chdir(tmp_path)
    for name in ("stages", "encoder", "k_sweep", "decoding"):
        assert cli_main([name, "--dry-run", "--config", str(ROOT / "configs/qwen3vl-4b.yaml")]) == 0
        out = capsys.readouterr().out
        assert "# W = the experiment's --workdir" in out
        cmds = [x for x in out.splitlines() if "dlr_jax.train" in x]
        assert cmds and all("--workdir W/" in x for x in cmds)
    assert cli_main(["main", "--seeds", "1"]) == 2
    assert "--workdir W is required" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    assert cli_main(["no_rl", "--workdir", str(tmp_path), "--matched-baselines", "--dry-run"]) == 2
    assert "main experiment" in capsys.readouterr().err
    assert cli_main(["main", "--workdir", str(tmp_path), "--seeds", "0"]) == 2
    assert cli_main(["main", "--workdir", str(tmp_path), "--set", "latent.nope=1", "--dry-run"]) == 2
    with pytest.raises(SystemExit):
        cli_main(["main", "--workdir", str(tmp_path), "--k-values", "a,b"])
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    assert "forced_stop" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Running (stand-in commands that write the files a stage would).


def _writer(*files: Path, code: int = 0) -> tuple[str, ...]:
    body = "".join(f"p=pathlib.Path({str(f)!r}); p.parent.mkdir(parents=True, exist_ok=True); p.write_text('{{}}');"
                   for f in files)
    return (sys.executable, "-c", f"import pathlib,sys; print('working'); {body} sys.exit({code})")


def test_run_steps_skips_done_links_and_reports_failures(tmp_path):
    a, b, c = tmp_path / "main/a/final/meta.json", tmp_path / "v/b.json", tmp_path / "main/c.json"
    logs = tmp_path / "logs"
    steps = [Step(0, "main", "train", "a", _writer(a), (a,), tmp_path / "main", log=logs / "a.log"),
             Step(0, "v", "train", "b", _writer(b), (b,), tmp_path / "v",
                  links=((tmp_path / "v/a", tmp_path / "main/a"),), log=logs / "b.log"),
             Step(0, "main", "evaluate", "c", _writer(code=3), (c,), tmp_path / "main", log=logs / "c.log")]
    seen: list[int] = []
    msgs: list[str] = []
    assert runner.run_steps(steps, after_results=seen.append, out=msgs.append) == 3
    assert a.is_file() and b.is_file() and os.readlink(tmp_path / "v/a") == "../main/a"
    assert "FAILED (exit 3)" in msgs[-1] and "working" in msgs[-1] and seen == []
    # exit 0 without its outputs is a failure too; a rerun skips what is done
    steps[2] = Step(0, "main", "evaluate", "c", _writer(), (c,), tmp_path / "main", log=logs / "c.log")
    msgs.clear()
    assert runner.run_steps(steps, after_results=seen.append, out=msgs.append) == 1
    assert "done earlier" in msgs[0] and "done earlier" in msgs[1] and "is missing" in msgs[-1]
    steps[2] = Step(0, "main", "evaluate", "c", _writer(c), (c,), tmp_path / "main", log=logs / "c.log")
    assert runner.run_steps(steps, after_results=seen.append, out=msgs.append) == 0 and seen == [0]
    # a link over something else is refused, not replaced
    (tmp_path / "w").mkdir()
    (tmp_path / "w/a").mkdir()
    with pytest.raises(FileExistsError):
        runner.make_links(Step(0, "w", "train", "x", (), (), tmp_path / "w",
                               links=((tmp_path / "w/a", tmp_path / "main/a"),)))


# ---------------------------------------------------------------------------------------------
# Report and plots from results files.


def _results(root: Path, seed: int, m: Method, p: float, L: float, gen: float, wall: float) -> None:
    f = report.results_path(root, seed, m)
    f.parent.mkdir(parents=True, exist_ok=True)
    one = lambda v: {"mean": v, "std": 0.0, "per_seed": [v]}  # noqa: E731
    f.write_text(json.dumps({"benchmarks": {"synthetic": {
        "n": 500, "pass_at_1": one(p), "L": one(L), "n_latents": one(L if m.stage in ("sft", "rl") else 0),
        "gen_tokens": one(gen), "wall_s_per_question": one(wall * 2), "warm_wall_s_per_question": one(wall)}}}))


def test_report_table_gap_cost_and_plots(tmp_path):
    exp = experiment("ablations", _tiny())
    main = experiment("main", _tiny())
    acc = {"Direct-SFT": [0.08, 0.10, 0.09], "CoT-SFT": [0.50, 0.46, 0.48], "DLR-SFT": [0.20, 0.22, 0.18],
           "DLR-Full": [0.30, 0.28, 0.26]}
    for s in range(3):
        for m in main.methods:
            cot = m.label == "CoT-SFT"
            _results(tmp_path, s, m, acc[m.label][s], 40.0 if cot else 4.0, 50.0 if cot else 10.0,
                     0.010 if cot else 0.002)
        mains = {report.results_path(tmp_path, s, x) for x in main.methods}
        for i, m in enumerate(x for x in exp.methods if report.results_path(tmp_path, s, x) not in mains):
            _results(tmp_path, s, m, 0.2 - 0.01 * i + 0.001 * s, 4.0, 10.0, 0.002)
        f = tmp_path / f"seed{s}/main/rl/metrics.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in [{"step": 1, "reward": 0.1}, {"step": 0, "eval/reward": 0.2},
                                                             {"step": 2, "reward": 0.3, "eval/reward": 0.25}]))
    res = report.build(main, root=tmp_path, seeds=[0, 1, 2], command="cmd", config=TINY, overrides=[], steps_done=30,
                       steps_total=30)
    table = res["summary"]["synthetic"]
    assert table["DLR-SFT"]["pass_at_1"]["mean"] == pytest.approx(0.2)
    assert table["DLR-SFT"]["p_vs_full"] == pytest.approx(paired_t_test(acc["DLR-SFT"], acc["DLR-Full"])[1])
    assert "p_vs_full" not in table["DLR-Full"]
    gap = res["gap_closed"]["synthetic"]["DLR-Full"]["per_seed"]
    assert gap == pytest.approx([(0.30 - 0.08) / 0.42, (0.28 - 0.10) / 0.36, (0.26 - 0.09) / 0.39])
    (full_cost,) = [c for c in res["cost"]["synthetic"] if c["vs"] == "DLR-Full"]
    assert full_cost["L_ratio"] == 10 and full_cost["gen_tokens_ratio"] == 5
    assert full_cost["warm_wall_s_per_question_ratio"] == pytest.approx(5)
    assert [e[:2] for e in res["reward_curves"]["main"]["0"]["eval"]] == [[0, 0.2], [2, 0.25]]
    assert res["reward_curves"]["main"]["0"]["train"] == [[1, 0.1], [2, 0.3]]
    md = tables.markdown(res)
    assert "| DLR-SFT | 3 | 20.0 ± 1.6 | 20.0, 22.0, 18.0 |" in md and "closed" in md and "#L 10.0×" in md
    tables.write(res, tmp_path / "out")
    assert json.loads((tmp_path / "out/results.json").read_text())["experiment"] == "main"
    made = plots.write_plots(res, tmp_path / "out")
    assert [p.name for p in made] == ["rl_reward.png"]  # main has no sweep
    ab = report.build(exp, root=tmp_path, seeds=[0, 1, 2], command="cmd", config=TINY, overrides=[],
                      steps_done=1, steps_total=2)
    made = plots.write_plots(ab, tmp_path / "ab")
    assert sorted(p.name for p in made) == ["forced_stop.png", "k_sweep.png", "rl_reward.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in made)
    assert "w/o process reward" in tables.markdown(ab)


def test_report_closes_the_gap_between_the_matched_baselines_too(tmp_path):
    exp = experiment("main", _tiny(), matched=True)
    acc = {"Direct-SFT": [0.08, 0.10], "CoT-SFT": [0.50, 0.46], MATCHED_DIRECT: [0.30, 0.32],
           MATCHED_COT: [0.90, 0.94], DIRECT_FROM_COT: [0.35, 0.36], "DLR-SFT": [0.36, 0.40], "DLR-Full": [0.30, 0.28]}
    for s in range(2):
        for m in exp.methods:
            cot = "CoT" in m.label
            _results(tmp_path, s, m, acc[m.label][s], 40.0 if cot else 4.0, 50.0 if cot else 10.0, 0.002)
        _trained(tmp_path / f"seed{s}/main", "textsft_direct", 300)  # short, but the matched rows are there
        (tmp_path / f"seed{s}/main/config.yaml").write_text("init_from: null\n")
        for stage, n in (("textsft_cot", 800), ("align", 100), ("sft", 400), ("rl", 40)):
            _trained(tmp_path / f"seed{s}/main", stage, n)
        (tmp_path / f"seed{s}/matched").mkdir(exist_ok=True)
        (tmp_path / f"seed{s}/matched/config.yaml").write_text("init_from: null\n")
        for stage in ("textsft_cot", "textsft_direct"):
            _trained(tmp_path / f"seed{s}/matched", stage, 1300)
    res = report.build(exp, root=tmp_path, seeds=[0, 1], command="cmd", config=TINY, overrides=[], steps_done=26,
                       steps_total=26)
    assert res["gap_closed_matched"]["synthetic"]["DLR-SFT"]["per_seed"] == pytest.approx(
        [(0.36 - 0.30) / 0.60, (0.40 - 0.32) / 0.62])
    assert res["gap_closed"]["synthetic"]["DLR-SFT"]["per_seed"] == pytest.approx(
        [(0.36 - 0.08) / 0.42, (0.40 - 0.10) / 0.36])
    assert {c["vs"] for c in res["cost"]["synthetic"]} == {"DLR-SFT", "DLR-Full"}  # baselines are not latent rows
    md = tables.markdown(res)
    assert f"| {MATCHED_COT} | 2 | 92.0 ± 2.0 |" in md and "| 1300 CoT-SFT |" in md
    assert "gap between the budget-matched baselines closed" in md and "DLR-SFT 11 ± 1 %" in md
    assert "(DLR-Full adds its GRPO steps to DLR-SFT's budget)" in md
    assert "Direct-SFT → CoT-SFT gap (baselines of the config's own length) closed" in md
    assert "budgets differ" not in md  # the matched rows are the fair comparison the warning asks for
    # the control: DLR-SFT minus Direct-SFT from CoT-SFT, paired over seeds
    d = res["dlr_sft_vs_direct_from_cot"]["synthetic"]
    assert d["per_seed"] == pytest.approx([0.01, 0.04])
    assert d["p"] == pytest.approx(paired_t_test(acc["DLR-SFT"], acc[DIRECT_FROM_COT])[1])
    assert f"DLR-SFT minus {DIRECT_FROM_COT} (the same CoT-SFT start" in md and "+2.5 ± 1.5 points over 2 seeds" in md
    # one table, one set of rows: a run with the matched rows does not fold in a run without them, nor back
    assert res["matched_baselines"] is True
    plain = report.build(experiment("main", _tiny()), root=tmp_path, seeds=[0], command="cmd", config=TINY,
                         overrides=[], steps_done=1, steps_total=1, recipe="r")
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    (tmp_path / "matched.json").write_text(json.dumps({**res, "recipe": "r"}))
    with pytest.raises(ValueError, match="without --matched-baselines, this run with"):
        report.load_merge(tmp_path / "plain.json", exp, config=TINY, overrides=[], recipe="r")
    with pytest.raises(ValueError, match="with --matched-baselines, this run without"):
        report.load_merge(tmp_path / "matched.json", experiment("main", _tiny()), config=TINY, overrides=[], recipe="r")
    assert report.load_merge(tmp_path / "matched.json", exp, config=TINY, overrides=[], recipe="r")["seeds"] == [0, 1]
    # a matched run from before the control row existed has fewer rows: not folded in either
    older = {**res, "recipe": "r", "methods": [m for m in res["methods"] if m["label"] != DIRECT_FROM_COT]}
    (tmp_path / "older.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match=f"no {DIRECT_FROM_COT} row"):
        report.load_merge(tmp_path / "older.json", exp, config=TINY, overrides=[], recipe="r")


def test_seeds_run_on_two_machines_merge_into_the_table_one_machine_would_write(tmp_path, capsys):
    main = experiment("main", _tiny())
    acc = {"Direct-SFT": [0.08, 0.10, 0.09], "CoT-SFT": [0.50, 0.46, 0.48], "DLR-SFT": [0.20, 0.22, 0.18],
           "DLR-Full": [0.30, 0.28, 0.26]}
    one, a, b = tmp_path / "one", tmp_path / "a", tmp_path / "b"  # a ran seed 0, b seeds 1 and 2
    for s in range(3):
        for root in (one, a if s == 0 else b):
            w = root / f"seed{s}/main"
            w.mkdir(parents=True)
            (w / "config.yaml").write_text("init_from: null\n")
            for stage, n in (("textsft_direct", 300 + s), ("textsft_cot", 800), ("align", 100), ("sft", 400),
                             ("rl", 40)):
                _trained(w, stage, n)
            for m in main.methods:
                _results(root, s, m, acc[m.label][s], 4.0, 10.0, 0.002)
            (w / "rl/metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.1 * s}) + "\n")
    cfg = load_config(TINY, ["latent.source=codebook"])
    recipe = report.recipe_hash(cfg)
    kw = dict(command="cmd", config=TINY, overrides=["latent.source=codebook"], steps_done=10, steps_total=10,
              recipe=recipe)
    ref = report.build(main, root=one, seeds=[0, 1, 2], **kw)
    tables.write(report.build(main, root=a, seeds=[0], **kw), a / "main")
    load = dict(config=TINY, overrides=["latent.source=codebook"], recipe=recipe)
    other = report.load_merge(a / "main/results.json", main, **load)
    res = report.build(main, root=b, seeds=[1, 2], merge=[(a / "main/results.json", other)], **kw)
    assert res["seeds"] == [0, 1, 2] and res["merged_from"][0]["seeds"] == [0]
    for label in acc:
        assert res["summary"]["synthetic"][label]["pass_at_1"]["per_seed"] == pytest.approx(acc[label])
        if label != "DLR-Full":
            assert res["summary"]["synthetic"][label]["p_vs_full"] == pytest.approx(
                ref["summary"]["synthetic"][label]["p_vs_full"])
    for label in ("DLR-SFT", "DLR-Full"):
        assert res["gap_closed"]["synthetic"][label]["per_seed"] == pytest.approx(
            ref["gap_closed"]["synthetic"][label]["per_seed"])
    assert res["training_steps"] == ref["training_steps"] and res["reward_curves"] == ref["reward_curves"]
    md = tables.markdown(res)
    assert "| DLR-SFT | 3 | 20.0 ± 1.6 |" in md and "| Direct-SFT | 3 |" in md and "| differ by seed |" in md
    head = md.split("\n\n")[1].split("\n")  # the header paragraph: every line but the last ends in a hard break
    assert "steps done 10 of 10 on this machine" in head[2] and all(x.endswith("  ") for x in head[:-1])
    assert head[-1].startswith("Seeds [0] from `") and "(steps done 10 of 10 there)" in head[-1]
    # this run's own seeds win over a merged file's
    changed = json.loads(json.dumps(ref))
    for m in changed["methods"]:
        for r in m["per_seed"].values():
            r["synthetic"]["pass_at_1"] = 0.99
    again = report.build(main, root=b, seeds=[1, 2], merge=[(Path("x"), changed)], **kw)
    assert again["merged_from"][0]["seeds"] == [0]
    assert again["summary"]["synthetic"]["DLR-SFT"]["pass_at_1"]["per_seed"] == pytest.approx([0.99, 0.22, 0.18])
    # another recipe (--set list or its order, resolved config) or experiment is refused, and so is junk
    with pytest.raises(ValueError, match="one table must hold one recipe"):
        report.load_merge(a / "main/results.json", main, **{**load, "overrides": []})
    with pytest.raises(ValueError, match="resolved config"):
        report.load_merge(a / "main/results.json", main, **{**load, "recipe": report.recipe_hash(
            load_config(TINY, ["latent.source=codebook", "train.sft.num_steps=7"]))})
    with pytest.raises(ValueError, match="experiment 'main'"):
        report.load_merge(a / "main/results.json", experiment("no_rl", _tiny()), **load)
    old = {k: v for k, v in json.loads((a / "main/results.json").read_text()).items() if k != "recipe"}
    (tmp_path / "old.json").write_text(json.dumps(old))  # written before "recipe": the config file name decides
    assert report.load_merge(tmp_path / "old.json", main, **load)["seeds"] == [0]
    with pytest.raises(ValueError, match="its config is"):
        report.load_merge(tmp_path / "old.json", main, **{**load, "config": "configs/qwen3-4b.yaml"})
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="not an experiment's results.json"):
        report.load_merge(tmp_path / "list.json", main, **load)
    # the CLI: --seed-ids plans only those seeds; bad --seed-ids / --merge are errors, not tracebacks
    assert cli_main(["main", "--workdir", str(b), "--seed-ids", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "seed 2 main" in out and "seed 0 main" not in out and "seed 1 main" not in out
    assert cli_main(["main", "--workdir", str(b), "--seed-ids", "1,1", "--dry-run"]) == 2
    assert cli_main(["main", "--workdir", str(b), "--seed-ids", "1", "--seeds", "2", "--dry-run"]) == 2
    assert cli_main(["main", "--workdir", str(b), "--merge", str(a / "nope.json"), "--dry-run"]) == 2
    assert "cannot read it" in capsys.readouterr().err


def _trained(w: Path, stage: str, steps: int, *, finished: bool = True) -> None:
    d = w / stage
    (d / "final").mkdir(parents=True, exist_ok=True)
    if finished:
        (d / "final" / "meta.json").write_text("{}")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in (steps // 2, steps)))


def test_report_gives_each_method_its_training_steps_and_flags_unequal_budgets(tmp_path):
    main = experiment("main", _tiny())
    for s in range(2):
        w = tmp_path / f"seed{s}/main"
        w.mkdir(parents=True)
        (w / "config.yaml").write_text("init_from: null\n")
        for stage, n in (("textsft_direct", 300), ("textsft_cot", 800), ("align", 100), ("sft", 400), ("rl", 40)):
            _trained(w, stage, n)
        for m in main.methods:
            _results(tmp_path, s, m, 0.3, 4.0, 10.0, 0.002)
    direct, dlr_sft, dlr_full = (next(m for m in main.methods if m.label == x)
                                 for x in ("Direct-SFT", "DLR-SFT", "DLR-Full"))
    assert report.training_steps(tmp_path, 0, dlr_sft) == {"textsft_cot": 800, "align": 100, "sft": 400}
    assert report.training_steps(tmp_path, 0, direct) == {"textsft_direct": 300}
    res = report.build(main, root=tmp_path, seeds=[0, 1], command="cmd", config=TINY, overrides=[], steps_done=20,
                       steps_total=20)
    md = tables.markdown(res)
    assert "| 800 CoT-SFT + 100 align + 400 SFT + 40 GRPO |" in md and "| 300 Direct-SFT |" in md
    assert "Direct-SFT trained 300 steps, DLR-SFT's model 1300 in all" in md
    assert "--set train.textsft_direct.num_steps=1300" in md
    # equal budgets: no warning; an unfinished stage has no count yet; with init_from the latent stages start
    # from the checkpoint, not from CoT-SFT
    for s in range(2):
        _trained(tmp_path / f"seed{s}/main", "textsft_direct", 1300)
    assert "budgets differ" not in tables.markdown(report.build(main, root=tmp_path, seeds=[0, 1], command="cmd",
                                                                config=TINY, overrides=[], steps_done=20,
                                                                steps_total=20))
    _trained(tmp_path / "seed1/main", "rl", 20, finished=False)
    (tmp_path / "seed1/main/rl/final/meta.json").unlink()
    assert report.training_steps(tmp_path, 1, dlr_full) is None
    (tmp_path / "seed0/main/config.yaml").write_text("init_from: weights/qwen3-4b\n")
    assert report.training_steps(tmp_path, 0, dlr_full) == {"align": 100, "sft": 400, "rl": 40}


# ---------------------------------------------------------------------------------------------
# End to end.


@pytest.mark.slow
def test_main_end_to_end_on_a_micro_config(tmp_path):
    """`main --seeds 1`: every stage (codebook latents, process reward on), four evaluations, the table;
    a rerun skips everything."""
    from tests.cli_micro import MICRO, child_env, micro_yaml
    from tests.micro import codebook_nets

    extra = [*codebook_nets(num_queries=4), "latent.source=codebook", "rl.process_weight=0.25",
             "codebook.train.num_steps=3", "codebook.warmup_steps=1", "codebook.alpha_steps=1",
             "codebook.kmeans_init_batches=1", "codebook.eval_examples=8", "codebook.train.batch_size=8",
             "codebook.train.async_checkpointing=false", "codebook.train.progress=false", "codebook.dead_code_every=0",
             "codebook.eval_batch_size=16", "eval.batch_size=8"]
    cfg = micro_yaml(tmp_path / "micro.yaml", [*MICRO, *extra])
    cmd = [sys.executable, "-m", "dlr_jax.experiments", "main", "--seeds", "1", "--workdir", str(tmp_path / "w"),
           "--config", str(cfg)]
    r = subprocess.run(cmd, env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "w/main/results.json").read_text())
    assert set(res["summary"]["synthetic"]) == {"Direct-SFT", "CoT-SFT", "DLR-SFT", "DLR-Full"}
    assert res["status"] == {"steps_done": 10, "steps_total": 10}
    assert all(r["wall_s_per_question"]["mean"] > 0 for r in res["summary"]["synthetic"].values())
    assert (tmp_path / "w/main/rl_reward.png").is_file() and "| DLR-Full | 1 |" in r.stdout
    again = subprocess.run(cmd, env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done earlier, skipping") == 10


def test_no_align_variant_trains_align_with_zero_updates():
    """w/o align = align's one step at learning rate 0: the optimizer it gets must leave every
    parameter where it was built (weight decay included), so sft starts from the untrained projectors."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dlr_jax.training.optimizer import make_optimizer

    (variant,) = [v for v in experiment("no_align", _tiny()).variants if v.name == "no_align"]
    paper = load_config(ROOT / "configs" / "qwen3-4b.yaml", list(variant.overrides))
    assert paper.train.align.num_epochs == 0 and paper.train.align.num_steps == 1  # epochs do not win
    cfg = load_config(TINY, ["latent.source=codebook", *variant.overrides]).train.align
    tx, _ = make_optimizer(cfg)
    params = {"w": jnp.asarray(np.random.RandomState(0).randn(4, 3), jnp.float32), "b": jnp.ones(3)}
    grads = jax.tree.map(lambda x: x * 5.0 + 1.0, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    assert all(float(jnp.max(jnp.abs(u))) == 0.0 for u in jax.tree.leaves(updates))


def test_report_only_on_a_fresh_workdir_records_the_run_command(tmp_path, capsys):
    assert cli_main(["main", "--workdir", str(tmp_path), "--seeds", "2", "--report-only"]) == 0
    res = json.loads((tmp_path / "main/results.json").read_text())
    # tiny.yaml says latent.source=random: textsft, align, sft, rl and 4 evaluations per seed
    assert res["status"] == {"steps_done": 0, "steps_total": 16} and res["summary"] == {}
    assert res["command"].endswith(f"main --workdir {tmp_path} --seeds 2")
    assert (tmp_path / "main/table.md").read_text().startswith("### Experiment `main`")
    assert not list((tmp_path / "main").glob("*.png"))
