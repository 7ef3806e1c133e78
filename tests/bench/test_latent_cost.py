"""The latent-vs-CoT cost benchmark on a workdir of untrained micro models (no training: the stages'
own formats, written directly)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dlr_jax.bench import cli, latent_cost
from dlr_jax.config import load_config
from dlr_jax.core.sharding import make_mesh
from dlr_jax.data.sources import load_examples
from dlr_jax.run.handoff import save_stage_model
from dlr_jax.stages import common
from dlr_jax.stages.latent_common import new_latent_lm
from tests import cli_micro

ROOT = Path(__file__).resolve().parents[2]
# The CLI tests' micro model, with evaluation lengths an untrained model finishes in.
MICRO = [*cli_micro.MICRO, "data.synthetic_train=60", "data.synthetic_eval=12", "latent.num_latents=16",
         "eval.max_new_tokens=24", "eval.max_latents=4"]
INFO = {"cpu": "test cpu", "cores": "2 usable of 2", "load": "0.10", "versions": "v", "date": "today"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """textsft_direct and textsft_cot backbones and an sft latent LM, random weights, in a real workdir."""
    import jax

    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO)
    w = tmp_path_factory.mktemp("cost")
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    common.prepare_workdir(cfg, w)
    tok = common.get_tokenizer(cfg, w, load_examples(cfg, "train"))
    for stage in ("textsft_direct", "textsft_cot"):
        backbone = common.new_backbone(cfg, tok, mesh)
        save_stage_model(backbone, w, stage, kind="backbone", model_cfg=backbone.cfg)
    lm = new_latent_lm(cfg, w, tok, mesh)
    save_stage_model(lm, w, "sft", kind="latent_lm", model_cfg=lm.model_cfg)
    return w


def test_every_method_answers_the_same_questions_and_the_table_has_ratios(workdir):
    res = latent_cost.bench_latent_cost(workdir, questions=8, batch=4, repeats=2, log=lambda _: None)
    assert [m.label for m in res.methods] == ["Direct-SFT", "CoT-SFT", "DLR-SFT"]  # no rl stage: no DLR-Full row
    assert res.questions == 8 and res.benchmark == "synthetic"
    for m in res.methods:
        assert len(m.wall) == 2 and all(w > 0 for w in m.wall)
        assert m.tokens >= 1
    direct, _, dlr = res.methods
    assert direct.reasoning_len == 0
    assert dlr.reasoning_len <= 4  # eval.max_latents caps an untrained model's latents
    text = latent_cost.render_section([res], "python -m dlr_jax.bench --only latent_cost", INFO, allow_load=True)
    assert "| DLR-SFT |" in text and "| CoT-SFT |" in text and "| Direct-SFT |" in text
    assert "Cap on this task" in text and "×" in text and "#### Batches of 4 (throughput)" in text
    assert f"### `{workdir}`" in text and "1-4 steps" in text
    one = latent_cost.bench_latent_cost(workdir, questions=3, batch=1, repeats=1, log=lambda _: None)
    # one question a call: the same greedy answers as in batches of 4
    assert [m.pass_at_1 for m in one.methods] == pytest.approx([m.pass_at_1 for m in
                                                               latent_cost.bench_latent_cost(
                                                                   workdir, questions=3, batch=3, repeats=1,
                                                                   log=lambda _: None).methods])
    assert "(latency: one question at a time)" in latent_cost.render_section([one], "cmd", INFO, allow_load=True)


def test_ratios_are_withheld_on_a_loaded_machine(workdir):
    m = latent_cost.MethodCost
    res = latent_cost.CostResult("w", 8, 4, 1, "synthetic", "test", "llama", [
        m("Direct-SFT", "textsft_direct", "direct", 5.0, 0.0, 4.0, [0.001]),
        m("CoT-SFT", "textsft_cot", "cot", 50.0, 20.0, 24.0, [0.004]),
        m("DLR-SFT", "sft", "latent", 9.0, 4.0, 10.0, [0.0016])], task="1-4 steps", loads=[3.0])
    loaded = latent_cost.render_section([res], "cmd", INFO)
    assert "not written" in loaded and "Cap on this task" not in loaded
    idle = latent_cost.render_section([dataclass_replace(res, loads=[0.2])], "cmd", INFO)
    # CoT / DLR: #L 20/4 = 5.0x, tokens 24/10 = 2.4x, wall 4/1.6 = 2.5x; the cap CoT / Direct = 4.0x
    assert "| 5.0× | 2.4× | 2.5× |" in idle and "~4.0×" in idle


def dataclass_replace(res, **kw):
    import dataclasses

    return dataclasses.replace(res, **kw)


def test_arguments_name_what_is_missing(workdir, tmp_path):
    args = argparse.Namespace(cost_questions=8, cost_batches="4,1", cost_workdir=[workdir, tmp_path])
    assert latent_cost.check_arguments(args) is None  # the arguments are fine; a workdir lacks the models
    assert "not a dlr_jax workdir" in latent_cost.missing_inputs(args)
    args.cost_workdir = [workdir]
    assert latent_cost.missing_inputs(args) is None
    args.cost_questions = 0
    assert "--cost-questions" in latent_cost.check_arguments(args)
    args.cost_questions, args.cost_batches = 8, "4,0"
    assert "--cost-batches" in latent_cost.check_arguments(args)


def test_make_bench_skips_it_without_a_trained_workdir_but_only_names_it_fail(tmp_path, capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(cli, "BENCHMARKS", ("latent_cost",))  # nothing else: the test runs no benchmark
    monkeypatch.setattr(latent_cost, "run_section", lambda *a, **k: ran.append(1) or "x")
    cli.main(["--out", str(tmp_path / "B.md"), "--cost-workdir", str(tmp_path / "none")])
    assert "latent_cost: skipped" in capsys.readouterr().out and not ran
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path / "B.md"), "--only", "latent_cost", "--cost-workdir", str(tmp_path / "none")])


def test_the_table_names_the_chain_style_of_a_natural_chain_task():
    from dlr_jax.config import DataConfig

    assert latent_cost.task_description(DataConfig()) == "1-4 steps, operands up to 10, values up to 200"
    natural = latent_cost.task_description(DataConfig(synthetic_min_steps=3, synthetic_max_steps=6,
                                                      synthetic_cot_style="natural"))
    assert natural == "3-6 steps, operands up to 10, values up to 200, natural chains (sentences)"
    assert latent_cost.task_description(DataConfig(dataset="gsm8k_aug")) == "gsm8k_aug"
