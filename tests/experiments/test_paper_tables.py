"""The paper's tables as experiments: `stages` (-Align, -SFT, -RL, -Proc, Full), `k_sweep` on the paper's grid,
`decoding` with its forced stops and `encoder` (DeepEncoder V2 vs Qwen3-VL's tower, each at two font sizes); their
full-scale commands (--dry-run), their tables in the paper's layout (from results files, with the paper's column),
and slow runs of all four on micro configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlr_jax.config import load_config
from dlr_jax.experiments import main as cli_main
from dlr_jax.experiments import paper_numbers, plots, report, tables
from dlr_jax.experiments.encoders import ENCODER_FROM_PLACEHOLDER
from dlr_jax.experiments.plan import STAGE_ROWS, experiment
from dlr_jax.experiments.rendering import half_font_overrides
from dlr_jax.run.preflight import check_rates

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")
VL = str(ROOT / "configs" / "qwen3vl-4b.yaml")


def test_the_three_tables_plan_the_papers_rows():
    cfg = load_config(TINY, ["latent.source=codebook"])
    st = experiment("stages", cfg)
    assert [m.label for m in st.methods] == [*STAGE_ROWS, "DLR-Full"] and st.full == "DLR-Full"
    rows = {m.label: (m.variant, m.stage) for m in st.methods}
    assert rows == {"−Align": ("no_align", "rl"), "−SFT": ("no_sft", "rl"), "−RL": ("main", "sft"),
                    "−Proc": ("no_process_reward", "rl"), "DLR-Full": ("main", "rl")}
    v = {x.name: x for x in st.variants}
    # -SFT: RL straight after align; sft runs one step at learning rate 0, so rl starts from align's model
    assert v["no_sft"].runs == ("sft", "rl") and v["no_sft"].reuse == ("textsft", "codebook", "export", "align")
    assert set(v["no_sft"].overrides) == {"train.sft.learning_rate=0.0", "train.sft.num_steps=1",
                                          "train.sft.num_epochs=0", "train.sft.warmup_ratio=0.0"}
    paper = load_config(VL, list(v["no_sft"].overrides))  # the recipe counts epochs: the one step wins
    assert (paper.train.sft.num_epochs, paper.train.sft.num_steps, paper.train.sft.learning_rate) == (0, 1, 0.0)
    check_rates(paper)  # a learning rate of 0 passes the preflight for sft, as for align (w/o Align)
    dec = experiment("decoding", cfg)
    assert [m.force_latents for m in dec.methods] == [None, 4, 6, 8, 10]  # dynamic, then the paper's stops
    assert experiment("forced_stop", cfg).methods[1].force_latents == 2  # its own defaults are kept
    ks = experiment("k_sweep", cfg)
    assert [m.x for m in ks.methods] == [512, 128, 256, 1024, 2048]  # K = 512: the paper's 2.5K..40K scaled


@pytest.mark.parametrize("name", ["stages", "k_sweep", "decoding"])
def test_dry_run_prints_the_full_scale_commands(name, tmp_path, capsys):
    w = tmp_path / "w"
    assert cli_main([name, "--dry-run", "--config", VL, "--workdir", str(w), "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert not w.exists()
    train = [x for x in out.splitlines() if "dlr_jax.train" in x]
    assert train and all(f"--config {VL}" in x for x in train)
    if name == "stages":
        assert "seed0/no_sft" in out and "--set train.sft.learning_rate=0.0" in out
        assert sum("--stage rl" in x for x in train) == 4  # Full, -Align, -SFT, -Proc (-RL is Full's sft)
    if name == "k_sweep":
        assert [k for k in (2500, 5000, 20000, 40000) if f"latent.num_latents={k} " in out] == [2500, 5000, 20000,
                                                                                                 40000]
    if name == "decoding":
        assert [n for n in (2, 4, 6, 8, 10) if f"--force-latents {n} " in out] == [4, 6, 8, 10]


def _results(root: Path, seed: int, m, benches: dict[str, tuple[float, float]]) -> None:
    f = report.results_path(root, seed, m)
    f.parent.mkdir(parents=True, exist_ok=True)
    one = lambda v: {"mean": v, "std": 0.0, "per_seed": [v]}  # noqa: E731
    f.write_text(json.dumps({"benchmarks": {b: {"n": 100, "pass_at_1": one(acc), "L": one(L)}
                                            for b, (acc, L) in benches.items()}}))


def test_tables_in_the_papers_layout_with_its_column(tmp_path, monkeypatch):
    cfg = load_config(VL)
    exp = experiment("stages", cfg)
    benches = ("gsm8k", "gsm_hard", "svamp", "multiarith")
    for s in (0, 1):
        for i, m in enumerate(exp.methods):
            step = 0.03 if m.label == "DLR-Full" else 0.02  # per-seed differences that vary: a t-test of them
            _results(tmp_path, s, m, {b: (0.1 * (i + 1) + 0.01 * j + step * s, 6.0 + j) for j, b in enumerate(benches)})
    res = report.build(exp, root=tmp_path, seeds=[0, 1], command="cmd", config=VL, overrides=[], steps_done=1,
                       steps_total=1)
    lay = res["paper_layout"]
    assert lay["benchmarks"] == list(benches) and lay["backbone"] == "qwen3vl-4b" and not lay["paper_on_record"]
    full = lay["rows"][-1]
    assert full["label"] == "DLR-Full" and full["avg"]["pass_at_1"]["per_seed"] == pytest.approx([0.515, 0.545])
    assert full["avg"]["L"]["mean"] == pytest.approx(7.5)
    md = tables.markdown(res)
    assert "| method | GSM8K Acc. | GSM8K #L | GSM-Hard Acc. |" in md and "Avg. Acc. | Avg. #L |" in md
    assert "| −Align | 11.0 ± 1.0 | 6.00 ± 0.00 |" in md and "none on record for backbone `qwen3vl-4b`" in md
    assert md.index("In the paper's layout") < md.index("Benchmark `gsm8k`")
    # the paper's cells, where on record for the backbone, sit beside ours
    cells = {b: (40.0 + j, 6.0) for j, b in enumerate(benches)}
    monkeypatch.setitem(paper_numbers.PAPER_NUMBERS, "stages", {"qwen3vl-4b": {"DLR-Full": cells}})
    res = report.build(exp, root=tmp_path, seeds=[0, 1], command="cmd", config=VL, overrides=[], steps_done=1,
                       steps_total=1)
    md = tables.markdown(res)
    assert "| 40 / 6 | 41 / 6 | 42 / 6 | 43 / 6 | 41.5 / 6 |" in md and "the paper's cells for backbone" in md
    assert "main" not in {r["label"] for r in res["paper_layout"]["rows"]}
    # other experiments keep their own tables only
    main = report.build(experiment("main", cfg), root=tmp_path, seeds=[0], command="c", config=VL, overrides=[],
                        steps_done=0, steps_total=1)
    assert "paper_layout" not in main and "paper's layout" not in tables.markdown(main)


def test_k_sweep_and_decoding_tables_draw_their_plots(tmp_path):
    cfg = load_config(TINY)
    for name, png in (("k_sweep", "k_sweep.png"), ("decoding", "forced_stop.png")):
        exp = experiment(name, cfg)
        for i, m in enumerate(exp.methods):
            _results(tmp_path / name, 0, m, {"synthetic": (0.2 + 0.05 * i, 4.0 + i)})
        res = report.build(exp, root=tmp_path / name, seeds=[0], command="c", config=TINY, overrides=[],
                           steps_done=1, steps_total=1)
        assert len(res["paper_layout"]["rows"]) == 5 and res["paper_layout"]["benchmarks"] == ["synthetic"]
        made = plots.write_plots(res, tmp_path / name / "out")
        assert png in [p.name for p in made]


ENCODER_ROWS = ["DeepEncoder V2", "DeepEncoder V2, half font", "Qwen3-VL ViT", "Qwen3-VL ViT, half font"]


def _hf_dir(path: Path, model_type: str) -> str:
    """A checkpoint directory as far as the planner reads one: its config.json's model_type."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(path)


def test_encoder_table_plans_four_rows_each_with_its_own_codebook(tmp_path):
    cfg = load_config(TINY, ["latent.source=codebook"])
    exp = experiment("encoder", cfg)
    assert [m.label for m in exp.methods] == ENCODER_ROWS and exp.full == "DeepEncoder V2" and not exp.needs
    assert [(m.variant, m.stage) for m in exp.methods] == [("main", "rl"), ("half_font", "rl"), ("qwen3_vl", "rl"),
                                                           ("qwen3_vl_half_font", "rl")]
    v = {x.name: x for x in exp.variants}
    # DeepEncoder V2 at half font is the half_font experiment's variant: one workdir serves both tables
    assert v["half_font"] == next(x for x in experiment("half_font", cfg).variants if x.name == "half_font")
    assert v["qwen3_vl"].overrides == ("codebook.encoder=qwen3_vl",)  # no checkpoint here: a from-scratch tower
    assert v["qwen3_vl_half_font"].overrides == ("codebook.encoder=qwen3_vl", *half_font_overrides(cfg))
    for name in ("half_font", "qwen3_vl", "qwen3_vl_half_font"):
        assert v[name].runs == ("codebook", "export", "align", "sft", "rl") and v[name].reuse == ("textsft",)
    # the full-scale backbone lends its own tower when init_from is a qwen3_vl checkpoint
    vl = _hf_dir(tmp_path / "vl", "qwen3_vl")
    paper = experiment("encoder", load_config(VL, [f"init_from={vl}"]))
    assert not paper.needs and {x.name: x.overrides for x in paper.variants}["qwen3_vl"] == (
        "codebook.encoder=qwen3_vl", f"codebook.encoder_from={vl}")
    # without init_from, or with a backbone that is no Qwen3-VL, the tower's directory must be given
    for over in ([], [f"init_from={_hf_dir(tmp_path / 'q3', 'qwen3')}"]):
        e = experiment("encoder", load_config(VL, over))
        assert "--encoder-from DIR" in e.needs
        qwen = {x.name: x for x in e.variants}["qwen3_vl"]
        assert f"codebook.encoder_from={ENCODER_FROM_PLACEHOLDER}" in qwen.overrides
    given = experiment("encoder", load_config(VL), encoder_from="/w/vl")
    assert not given.needs and {x.name: x for x in given.variants}["qwen3_vl_half_font"].overrides[:2] == (
        "codebook.encoder=qwen3_vl", "codebook.encoder_from=/w/vl")
    assert not experiment("encoder", load_config(VL), encoder_from="").needs  # from scratch, on purpose
    # a config whose encoder is Qwen3-VL's already: its rows are main's, DeepEncoder V2's get variants, and each
    # --set list loads in its order (encoder_from is refused while the encoder is not qwen3_vl)
    own = ["latent.source=codebook", "codebook.encoder=qwen3_vl", f"codebook.encoder_from={vl}"]
    e = experiment("encoder", load_config(TINY, own))
    assert [m.variant for m in e.methods] == ["deepencoder", "deepencoder_half_font", "main", "half_font"]
    de = {x.name: x for x in e.variants}["deepencoder"]
    assert de.overrides == ("codebook.encoder_from=", "codebook.encoder=deepencoder")
    c = load_config(TINY, [*own, *de.overrides]).codebook
    assert (c.encoder, c.encoder_from) == ("deepencoder", "")
    with pytest.raises(ValueError, match="latent.source=codebook"):
        experiment("encoder", load_config(TINY))
    with pytest.raises(ValueError, match="codebook.init_from"):  # DeepSeek-OCR-2 brings its own encoder
        experiment("encoder", load_config(ROOT / "configs" / "codebook-ocr2.yaml", ["codebook.init_from=/w/ocr2"]))
    with pytest.raises(ValueError, match="--encoder-from"):
        experiment("stages", cfg, encoder_from="/w/vl")


def test_encoder_dry_run_prints_the_full_scale_commands(tmp_path, capsys):
    w = tmp_path / "w"
    assert cli_main(["encoder", "--dry-run", "--config", VL, "--workdir", str(w), "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert not w.exists() and "# NOTE: before it can run" in out and "--encoder-from DIR" in out
    train = [x for x in out.splitlines() if "dlr_jax.train" in x]
    assert all(f"--config {VL}" in x for x in train)
    # the text SFTs once (main's), then codebook onwards and one evaluation per row
    assert [sum(f"--stage {s} " in x for x in train) for s in ("textsft", "codebook", "rl")] == [1, 4, 4]
    assert sum("dlr_jax.evaluate" in x for x in out.splitlines()) == 4
    qwen = [x for x in train if "seed0/qwen3_vl" in x]
    assert len(qwen) == 10 and all(f"'codebook.encoder_from={ENCODER_FROM_PLACEHOLDER}'" in x for x in qwen)
    assert [x for x in train if "codebook.font_mean=8.75" in x] == [x for x in train if "half_font " in x]
    # a run refuses while the tower is missing; a qwen3_vl init_from gives it
    assert cli_main(["encoder", "--config", VL, "--workdir", str(w), "--seeds", "1"]) == 2 and not w.exists()
    assert "--encoder-from DIR" in capsys.readouterr().err
    vl = _hf_dir(tmp_path / "vl", "qwen3_vl")
    assert cli_main(["encoder", "--dry-run", "--config", VL, "--set", f"init_from={vl}", "--workdir", str(w),
                     "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "NOTE" not in out and ENCODER_FROM_PLACEHOLDER not in out
    assert sum(f"--set codebook.encoder_from={vl} " in x for x in out.splitlines()) == 10


def test_encoder_table_in_the_papers_layout(tmp_path):
    exp = experiment("encoder", load_config(VL), encoder_from="/w/vl")
    benches = ("gsm8k", "gsm_hard", "svamp", "multiarith")
    for s in (0, 1):
        for i, m in enumerate(exp.methods):
            _results(tmp_path, s, m, {b: (0.4 - 0.05 * i + 0.01 * j + (0.02 + 0.01 * i) * s, 6.0 + i)
                                      for j, b in enumerate(benches)})
    res = report.build(exp, root=tmp_path, seeds=[0, 1], command="cmd", config=VL, overrides=[], steps_done=1,
                       steps_total=1)
    lay = res["paper_layout"]
    assert [r["label"] for r in lay["rows"]] == ENCODER_ROWS and not lay["paper_on_record"]
    assert lay["rows"][3]["avg"]["L"]["mean"] == pytest.approx(9.0)
    md = tables.markdown(res)
    assert "| DeepEncoder V2, half font | 36.5 ± 1.5 | 7.00 ± 0.00 |" in md
    assert "p vs DeepEncoder V2" in md and "Qwen3-VL's vision tower (from /w/vl (--encoder-from))" in md
    assert md.index("In the paper's layout") < md.index("Benchmark `gsm8k`")


@pytest.mark.slow
def test_the_three_tables_run_on_a_micro_config(tmp_path):
    """stages, decoding and k_sweep --seeds 1 on one workdir root (they share seed 0's main run): every stage and
    evaluation, each table (paper layout) and the sweep plots."""
    from tests.cli_micro import MICRO, child_env, micro_yaml

    cfg = micro_yaml(tmp_path / "micro.yaml", [*MICRO, "eval.batch_size=8"])
    w = tmp_path / "w"
    for name, extra in (("stages", []), ("decoding", ["--force-stops", "2,4"]), ("k_sweep", ["--k-values", "16"])):
        cmd = [sys.executable, "-m", "dlr_jax.experiments", name, "--seeds", "1", "--workdir", str(w),
               "--config", str(cfg), *extra]
        r = subprocess.run(cmd, env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        res = json.loads((w / name / "results.json").read_text())
        assert res["status"]["steps_done"] == res["status"]["steps_total"]
        assert [row["label"] for row in res["paper_layout"]["rows"]] == [m["label"] for m in res["methods"]]
        assert all(row["avg"] for row in res["paper_layout"]["rows"]) and "In the paper's layout" in r.stdout
    assert (w / "k_sweep" / "k_sweep.png").is_file() and (w / "decoding" / "forced_stop.png").is_file()


@pytest.mark.slow
def test_the_encoder_table_runs_on_a_micro_config(tmp_path):
    """encoder --seeds 1 on a micro config with the codebook's latents (tests/cli_micro.py MICRO_CODEBOOK): four
    codebooks, each trained in its own variant's workdir (DeepEncoder V2 / Qwen3-VL's from-scratch tower, at a
    128-px canvas and at half font on a 64-px one), each exported, aligned, SFT'd, RL'd and evaluated; the table
    in the paper's layout."""
    import numpy as np

    from tests.cli_micro import MICRO_CODEBOOK, child_env, micro_yaml

    cfg = micro_yaml(tmp_path / "micro.yaml", [*MICRO_CODEBOOK, "eval.batch_size=8"])
    w = tmp_path / "w"
    cmd = [sys.executable, "-m", "dlr_jax.experiments", "encoder", "--seeds", "1", "--workdir", str(w),
           "--config", str(cfg)]
    # one XLA cache for every stage process, small programs included: the variants' align, sft, rl and evaluation
    # (and the codebook stages' OCR decoders) are the same programs, read back instead of compiled again
    env = {**child_env(), "DLR_COMPILE_CACHE": str(tmp_path / "xla"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((w / "encoder" / "results.json").read_text())
    assert res["status"]["steps_done"] == res["status"]["steps_total"] == 25  # textsft once, then 4 x 6
    assert [row["label"] for row in res["paper_layout"]["rows"]] == ENCODER_ROWS
    assert all(row["avg"] for row in res["paper_layout"]["rows"]) and "In the paper's layout" in r.stdout
    assert "| Qwen3-VL ViT, half font |" in (w / "encoder" / "table.md").read_text()
    # each row's codebook is its own: trained in its variant's workdir with its encoder and canvas
    want = {"main": ("deepencoder", 128, 4.0), "half_font": ("deepencoder", 64, 1.0),
            "qwen3_vl": ("qwen3_vl", 128, 4.0), "qwen3_vl_half_font": ("qwen3_vl", 64, 1.0)}
    books = []
    for m in res["methods"]:
        out = w / "seed0" / m["variant"] / "codebook"
        assert not out.is_symlink() and not (w / "seed0" / m["variant"] / "latents").is_symlink()
        cb = json.loads((out / "final" / "meta.json").read_text())["codebook"]
        held = json.loads((out / "report.json").read_text())["held_out"]
        assert (cb["encoder"], cb["max_side"], held["mean_n"]) == want[m["variant"]]
        books.append(np.load(out / "codebook.npy"))
    assert all(not np.array_equal(a, b) for i, a in enumerate(books) for b in books[i + 1:])
