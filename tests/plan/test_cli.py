"""The planner compiles each stage's real step from abstract shapes and accounts for it honestly."""

from __future__ import annotations

import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.plan import cli as plan
from dlr_jax.plan import totals
from dlr_jax.plan.flops import dense_lm_flops
from dlr_jax.plan.targets import TARGETS, TargetUnavailable, target_devices, tpu_topology_name

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model.hidden_size=128", "model.intermediate_size=384", "model.num_layers=4", "model.num_heads=4",
         "model.num_kv_heads=2", "model.head_dim=32", "model.vocab_size=251", "latent.num_latents=128",
         "latent.latent_dim=32", "tokenizer.pad_multiple=128", "data.max_len=64", "train.sft.batch_size=16",
         "latent.dual_branch=off"]
MESH = {"data": 1, "fsdp": 8, "tensor": 1}


@pytest.fixture(scope="module")
def cfg():
    return load_config(ROOT / "configs" / "tiny.yaml", SMALL)


@pytest.mark.parametrize("layers", ["scan", "loop"])
def test_sft_plan_flops_match_6N_plus_attention(layers):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*SMALL, f"model.scan_layers={layers}"])
    r = plan.plan_once(cfg, "sft", TARGETS["cpu"], MESH)
    text_rows = -(-(251 + plan.BOUNDARY_TOKENS) // 128) * 128
    vocab = -(-(text_rows + 128) // 128) * 128
    analytic = dense_lm_flops(cfg.model, 16 * 64, 64, vocab=vocab)
    assert r["flops_per_step"] == pytest.approx(analytic, rel=0.10)
    assert r["flops_per_device"] == pytest.approx(r["flops_per_step"] / 8)
    if layers == "scan":  # XLA counts the layer scan's body once; the planner multiplies it by the 4 layers
        assert r["xla_flops_loop_bodies_once"] < 0.6 * r["flops_per_device"]
    else:  # the layers one after another (auto on CPU for <= 8 layers): XLA sees every layer, as we do
        assert r["xla_flops_loop_bodies_once"] == pytest.approx(r["flops_per_device"], rel=0.05)
    assert r["tokens_per_step"] == 16 * 64 and r["loops_counted_once"] == 0
    assert r["peak_bytes"] > 0 and not r["deviceless"]
    assert any("not a stand-in" in n for n in r["notes"])
    # the values are itemised and the vocabulary-sized ones found (the embedding's rows: vocab x hidden)
    assert r["largest_values"] and not any("not itemised" in n for n in r["notes"])
    assert any(vocab in v["shape"] for v in r["vocab_values"])


@pytest.mark.parametrize("stage", ["rl", "rollout", "codebook", "align", "textsft"])
def test_every_stage_plans_on_the_cpu_fallback(stage, cfg):
    r = plan.plan_once(cfg, stage, TARGETS["cpu"], MESH)
    assert r["flops_per_step"] > 0 and r["peak_bytes"] > 0 and r["devices"] == 8
    if stage == "rollout":  # the decode loop's body counts once per generated token after the first
        assert r["loops_counted_once"] == 0 and r["flops_per_device"] > 10 * r["xla_flops_loop_bodies_once"]


def test_textsft_plans_the_baseline_s_backbone_alone(cfg):
    """The CoT-SFT baseline's step: the backbone with its text rows only (no latent rows, projectors or codebook),
    every parameter trained; a row costs less than sft's, whose head also has the latent rows."""
    from dlr_jax.plan.programs import build_program, latent_lm_abstract
    from dlr_jax.plan.targets import target_mesh

    mesh = target_mesh(TARGETS["cpu"], MESH)

    def trained(stage):  # path -> shape of the parameters the step trains
        leaves = jax.tree_util.tree_leaves_with_path(build_program(cfg, stage, mesh).args[0])
        return {jax.tree_util.keystr(p): tuple(x.shape) for p, x in leaves}

    textsft, sft = trained("textsft"), trained("sft")
    assert textsft == {k.removeprefix("['backbone']"): v for k, v in sft.items() if k.startswith("['backbone']")}
    assert textsft["['embed'].value"][0] == latent_lm_abstract(cfg)[1].latent_offset  # the text rows only
    r = plan.plan_once(cfg, "textsft", TARGETS["cpu"], MESH)
    per_row = r["flops_per_step"] / cfg.train.textsft.batch_size  # its own batch size (tiny.yaml's)
    assert 0 < per_row < totals.step_flops(cfg, "sft", mesh) / cfg.train.sft.batch_size
    assert any("CoT-SFT baseline" in n for n in r["notes"])


def test_a_packed_dual_branch_step_is_compiled_for_its_own_roofline():
    """With a roofline, sft's dual branch on packed rows (S OCR rows a row) is compiled apart: its own step time and
    peak, and the stage's packed time is its packed steps at that step time, not the padded step's."""
    from dlr_jax.plan.lengths import Lengths
    from dlr_jax.plan.targets import Target

    small = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
             "model.num_kv_heads=1", "model.head_dim=16", "latent.num_latents=64", "latent.latent_dim=16",
             "codebook.dec_layers=1", "data.max_len=64", "train.sft.batch_size=4", "data.synthetic_train=300",
             "train.sft.num_epochs=2", "latent.dual_branch=on", "latent.source=codebook"]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", small)
    lengths = Lengths("sft", tuple([20] * 100 + [40] * 200), 300, ("by hand",), "-", False)
    roof = Target("cpu-roofline", "cpu", float("inf"), 1e12, 1e11)  # this host's compiler, a made-up roofline
    r = plan.plan_once(cfg, "sft", roof, {"data": 1, "fsdp": 1, "tensor": 1}, lengths)
    assert r["ocr_slots"] == 3 and r["flops_per_step_packed"] > r["flops_per_step"]
    assert r["peak_bytes_packed"] > 0 and r["roofline_step_s_packed"] > r["roofline_step_s"] > 0
    assert r["stage_roofline_s"] == r["stage_steps"] * r["roofline_step_s"]
    assert r["stage_roofline_s_packed"] == r["stage_steps_packed"] * r["roofline_step_s_packed"]
    text = plan.format_plan(r)
    assert "whole stage at the roofline (1 x cpu-roofline):" in text and "packed step" in text


def test_durations_read_as_a_run_s_length():
    assert [plan.format_duration(s) for s in (42, 600, 9000, 4e6)] == ["42 s", "10 min", "2.5 h", "1,111 h"]


def test_sft_with_the_dual_branch_costs_more(cfg):
    on = plan.plan_once(load_config(ROOT / "configs" / "tiny.yaml", [*SMALL, "latent.dual_branch=on",
                                                                     "latent.source=codebook", "data.pack=false"]),
                        "sft", TARGETS["cpu"], MESH)
    off = plan.plan_once(cfg, "sft", TARGETS["cpu"], MESH)
    assert on["flops_per_step"] > off["flops_per_step"] and "with the dual-branch OCR decoder" in on["notes"]


def test_rollout_plan_follows_sampling_unstack_layers(cfg):
    # the unstacked decode loop (auto on CPUs; opt-in on GPUs) holds a copy of the layer weights while it runs:
    # the planner must compile the loop the run would, and show that memory
    plans = {m: plan.plan_once(load_config(ROOT / "configs" / "tiny.yaml", [*SMALL, f"sampling.unstack_layers={m}"]),
                               "rollout", TARGETS["cpu"], MESH) for m in ("on", "off")}
    assert plans["on"]["flops_per_step"] == pytest.approx(plans["off"]["flops_per_step"], rel=0.01)
    assert plans["on"]["peak_bytes"] > plans["off"]["peak_bytes"]


def test_a_missing_compiler_or_a_bad_config_is_an_error_line_not_a_traceback(capsys):
    base = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--stage", "rollout", "--device", "cpu"]
    assert plan.main([*base, "--set", "sampling.unstack_layers=maybe"]) == 2
    assert "error: sampling.unstack_layers must be auto|on|off" in capsys.readouterr().err
    try:
        target_devices(TARGETS["h100"], 8)
    except TargetUnavailable:
        assert plan.main([*base[:4], "--device", "h100"]) == 2
        assert "error: h100: deviceless GPU compile unavailable" in capsys.readouterr().err


def test_recipe_totals_sit_beside_the_papers(capsys):
    args = ["--config", str(ROOT / "configs" / "paper" / "gsm8k.yaml"), "--stage", "align", "--device", "cpu",
            "--json", *sum((["--set", s] for s in SMALL[:8]), []), "--set", "data.max_len=64"]
    assert plan.main(args) == 0
    r = json.loads(capsys.readouterr().out)
    # GSM8K-Aug: align reads all 385,620 examples (the RL part too, as the paper), 3 epochs at 64 = 18,076 steps
    assert (r["stage_examples"], r["stage_steps"]) == (385_620, 18_076)
    assert r["paper_total_flops"] == 208e15 and r["stage_total_flops"] == pytest.approx(18_076 * r["flops_per_step"])
    assert totals.stage_total_flops(load_config(ROOT / "configs" / "paper" / "gsm8k.yaml", ["data.align_part=sft"]),
                                  "align", 1.0, types.SimpleNamespace(steps_per_epoch_examples=64))["stage_examples"] \
        == 300_000  # the SFT part: 385,620 - 85,620 RL


def test_cli_refuses_a_run_s_mesh_sizes_and_a_search_without_a_roofline(capsys):
    base = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--stage", "align"]
    for mesh in ("data=1,fsdp=-1,tensor=1", "data=1,fsdp=0,tensor=1"):
        with pytest.raises(SystemExit) as e:
            plan.main([*base, "--device", "h100", "--mesh", mesh])
        assert e.value.code == 2 and "a plan's mesh is explicit" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # nothing to rank by: refused before any compile
        plan.main([*base, "--device", "cpu", "--mesh", "data=1,fsdp=2,tensor=1", "--search"])
    assert e.value.code == 2 and "--device cpu has no roofline" in capsys.readouterr().err


def test_rl_totals_count_the_stage_s_steps_and_updates():
    """An RL step takes rl.num_prompts prompts (the stage's schedule: `resolve_schedule(per_step=num_prompts)`)
    and runs mu updates over its num_prompts x G rollouts; before, the plan divided by one update's batch."""
    from dlr_jax.data.protocol import steps_for_epochs

    cfg = load_config(ROOT / "configs" / "paper" / "gsm8k.yaml")
    rl = cfg.rl
    prog = types.SimpleNamespace(steps_per_epoch_examples=cfg.train.rl.batch_size)  # what the update program says
    r = totals.stage_total_flops(cfg, "rl", 1.0, prog)
    steps = steps_for_epochs(cfg.train.rl.num_epochs, 85_620, rl.num_prompts)  # what the stage runs: 42,810
    updates = steps * rl.inner_epochs * rl.num_prompts * rl.group_size // cfg.train.rl.batch_size
    assert (r["stage_examples"], steps, r["stage_steps"]) == (85_620, 42_810, updates) and updates == 171_240


def test_tpu_slice_names():
    assert [tpu_topology_name("v5p", n) for n in (4, 8, 16, 64)] == ["v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4",
                                                                      "v5p:4x4x4"]


@pytest.mark.parametrize("name", ["h100", "tpu-v5p"])
def test_deviceless_targets_compile_or_say_which_extra_is_missing(name, cfg):
    target = TARGETS[name]
    try:
        target_devices(target, 8)
    except TargetUnavailable as e:
        assert "pip install -e '.[" in str(e)
        pytest.skip(f"{name} compiler not installed here ({e}); the plan-gpu / tpu extras provide it")
    r = plan.plan_once(cfg, "sft", target, MESH)
    assert r["deviceless"] and r["fits"] and r["roofline_step_s"] > 0


@pytest.mark.parametrize("hidden", [512, 1024])
def test_h100_plans_a_bf16_model_with_a_real_vocabulary(hidden):
    """jaxlib 0.10.2's deviceless XLA:GPU compile fails to tile some bf16 lm-head weight gradients in Triton: the
    einsum form (attention.dense on GPU targets) avoids it at hidden 1024 and for the paper configs; where it
    still fails (hidden 512), the plan falls back to cuBLAS GEMMs and says so, instead of an error row."""
    try:
        target_devices(TARGETS["h100"], 8)
    except TargetUnavailable as e:
        pytest.skip(f"h100 compiler not installed here ({e}); the plan-gpu extra provides it")
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [
        *SMALL, "model.num_layers=1", f"model.hidden_size={hidden}", "model.intermediate_size=1024",
        "model.dtype=bfloat16", "model.vocab_size=32000"])
    r = plan.plan_once(cfg, "sft", TARGETS["h100"], MESH)
    assert r["fits"] and r["roofline_step_s"] > 0
    import jaxlib

    prefix = plan.TRITON_FALLBACK_NOTE.split("(")[0]
    notes = [n for n in r["notes"] if n.startswith(prefix)]
    if hidden == 1024:  # the 2-D form (attention.dense on CPU) fails here: the einsum must not
        assert not notes
    elif jaxlib.__version__ == "0.10.2":  # the XLA whose bug this works around (a later one may tile it)
        assert notes
    if notes:  # XLA's cost analysis misses the cuBLAS calls: the bound is used instead of its scaled bytes
        assert r["bytes_source"].startswith("lower bound")
        assert ", at dlr_jax/" in notes[0]  # where the GEMM came from, for a bug report


class _Lowered:
    """Stands in for jax's Lowered: its first compile raises `first`, a retry `retry` (None: succeeds)."""

    def __init__(self, first: Exception, retry: Exception | None = None):
        self.first, self.retry, self.options = first, retry, []

    def compile(self, compiler_options=None):
        self.options.append(compiler_options)
        if len(self.options) == 1:
            raise self.first
        if self.retry is not None:
            raise self.retry
        return "compiled"


_TILING = ("INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.1 = f32[512,32128]{1,0} dot(%a, %b)\n"
           "Suspected Python Code Location:\n  /home/u/src/dlr_jax/models/attention.py:102:8 [dense]\n"
           "  /home/u/src/dlr_jax/models/transformer.py:360:17 [Transformer.logits_from_hidden]\n"
           "  /home/u/src/dlr_jax/models/vocab_chunks.py:43:13 [_stats]\n  <frozen runpy>:88:4 [_run_code]")


def test_a_gemm_triton_cannot_tile_is_planned_with_cublas_and_named():
    low = _Lowered(RuntimeError(_TILING))
    compiled, note = plan._compile(low, TARGETS["h100"])
    assert compiled == "compiled" and low.options == [None, {"xla_gpu_enable_triton_gemm": False}]
    # past the shared matmul helper, relative to the package: not the host's absolute path, not the HLO line
    assert ", at dlr_jax/models/transformer.py:360 (Transformer.logits_from_hidden) <- " \
           "dlr_jax/models/vocab_chunks.py:43 (_stats))" in note
    assert "/home/u" not in note and "%dot" not in note
    # without XLA's location section: no place named, not the error's first line
    _, note = plan._compile(_Lowered(RuntimeError(_TILING.split("\n")[0])), TARGETS["h100"])
    assert "tile sizes\"); planned with cuBLAS" in note
    # another error, or another target, is the error itself; a failed retry says both
    for low, target in ((_Lowered(RuntimeError("INTERNAL: out of memory")), TARGETS["h100"]),
                        (_Lowered(RuntimeError(_TILING)), TARGETS["tpu-v5p"])):
        with pytest.raises(RuntimeError) as e:
            plan._compile(low, target)
        assert e.value is low.first and len(low.options) == 1
    with pytest.raises(RuntimeError, match="^ValueError: nope \\(in a retry with cuBLAS GEMMs, after Triton") as e:
        plan._compile(_Lowered(RuntimeError(_TILING), ValueError("nope")), TARGETS["h100"])
    assert "transformer.py:360" in str(e.value) and "%dot" not in str(e.value)


def _config_only(src: Path, dst: Path, names: tuple[str, ...] = ("config.json",)) -> Path:
    """A checkpoint directory holding only `names` of `src`: what a planner may read (no weights)."""
    dst.mkdir()
    for n in names:
        (dst / n).write_bytes((src / n).read_bytes())
    return dst


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_vl"])
def test_plan_takes_the_backbone_from_init_from(family, cfg, tmp_path):
    # a run with init_from builds the checkpoint's architecture, not the YAML's model section: so must its plan
    from dlr_jax.models.hf_config import model_config_from_hf
    from tests.hf_fixtures import save_tiny_hf

    save_tiny_hf(family, tmp_path / "ckpt")
    ckpt = _config_only(tmp_path / "ckpt", tmp_path / "config_only")
    hf = model_config_from_hf(ckpt)
    r = plan.plan_once(load_config(ROOT / "configs" / "tiny.yaml", [*SMALL, f"init_from={ckpt}"]), "sft",
                       TARGETS["cpu"], MESH)
    text_rows = -(-(hf.vocab_size + plan.BOUNDARY_TOKENS) // 128) * 128
    vocab = -(-(text_rows + 128) // 128) * 128
    assert r["flops_per_step"] == pytest.approx(dense_lm_flops(hf, 16 * 64, 64, vocab=vocab), rel=0.10)
    assert any("config.json (init_from" in n for n in r["notes"])
    # the YAML's model section (hidden 128, 4 layers) would cost far more: not what was planned
    assert dense_lm_flops(cfg.model, 16 * 64, 64, vocab=vocab) > 2 * r["flops_per_step"]


@pytest.mark.parametrize("family,fill", [("llama", True), ("qwen3", False)])
def test_planned_latent_lm_is_the_one_a_run_builds_from_init_from(family, fill, tmp_path):
    # every parameter shape of the plan's latent LM equals the run's (stages/latent_common.new_latent_lm):
    # the checkpoint's architecture, the tokenizer's rows (Llama-3 fills every row: the added tokens grow the
    # embedding; Qwen keeps spare rows that hold them), the latent rows after them
    from flax import nnx

    from dlr_jax.core.sharding import make_mesh
    from dlr_jax.plan.programs import backbone_notes, latent_lm_abstract
    from dlr_jax.stages import common
    from dlr_jax.stages.latent_common import new_latent_lm
    from tests.hf_fixtures import save_tiny_checkpoint

    save_tiny_checkpoint(family, tmp_path / "ckpt", vocab_size=320, fill_vocab=fill, hidden_size=64)
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*SMALL, f"init_from={tmp_path / 'ckpt'}", "model.remat=full"])
    tok = common.get_tokenizer(cfg, tmp_path / "w")
    run = new_latent_lm(cfg, tmp_path / "w", tok, make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    planned, lat = latent_lm_abstract(cfg)
    shapes = lambda m: {k: v.shape for k, v in nnx.to_flat_state(nnx.state(m, nnx.Param))}  # noqa: E731
    assert shapes(planned) == shapes(run)
    assert (lat.latent_offset, lat.total_vocab_size) == (tok.latent_offset, tok.total_vocab_size)
    assert planned.backbone.cfg.remat == "full" and planned.backbone.cfg.hidden_size == 64  # run keys from the YAML
    assert any("the tokenizer of" in n for n in backbone_notes(cfg))


def test_sft_plan_with_init_from_and_the_dual_branch(tmp_path):
    # the OCR branch reads the checkpoint's width (64), not the YAML model section's (128)
    from tests.hf_fixtures import save_tiny_hf

    save_tiny_hf("llama", tmp_path / "ckpt")
    c = load_config(ROOT / "configs" / "tiny.yaml", [*SMALL[:-1], f"init_from={tmp_path / 'ckpt'}",
                                                     "latent.dual_branch=auto", "latent.source=codebook",
                                                     "data.pack=false"])
    r = plan.plan_once(c, "sft", TARGETS["cpu"], MESH)
    assert "with the dual-branch OCR decoder" in r["notes"]


def _ocr2_cfg(ckpt: Path, *extra: str):
    return load_config(ROOT / "configs" / "tiny.yaml", [
        f"codebook.init_from={ckpt}", "codebook.min_side=128", "codebook.max_side=128", "codebook.max_text_len=40",
        "latent.num_latents=16", "latent.latent_dim=32", "codebook.train.batch_size=8", "codebook.char_dropout=0",
        "codebook.warmup_steps=0", *extra])


def test_codebook_plan_on_a_deepseek_ocr2_checkpoint(tmp_path):
    # codebook.init_from: the stage fine-tunes DeepSeek-OCR-2, so the plan compiles that network (from its
    # config.json and tokenizer.json alone), every one of its parameters trainable, plus the K x d_c codebook
    from flax import nnx

    from dlr_jax.stages.codebook import ocr2 as codebook_ocr2
    from tests.hf_fixtures import save_tiny_ocr2

    hf = save_tiny_ocr2(tmp_path / "ckpt", seed=0, small=True)
    ckpt = _config_only(tmp_path / "ckpt", tmp_path / "config_only", ("config.json", "tokenizer.json"))
    cfg = _ocr2_cfg(ckpt)
    one = {"data": 1, "fsdp": 1, "tensor": 1}
    r = plan.plan_once(cfg, "codebook", TARGETS["cpu"], one)
    assert any("DeepSeek-OCR-2" in n for n in r["notes"]) and r["tokens_per_step"] == 8 * (4 + 40)
    from dlr_jax.plan.programs import build_program
    from dlr_jax.plan.targets import target_mesh

    prog = build_program(cfg, "codebook", target_mesh(TARGETS["cpu"], one))
    batch = prog.args[3]  # what the stage feeds: grey uint8 canvases, token targets, alpha
    assert (batch["images"].shape, batch["images"].dtype) == ((1, 8, 128, 128), jnp.uint8)
    assert batch["targets"].shape == (1, 8, 40) and batch["alpha"].shape == (1, 8)
    model = codebook_ocr2.abstract_model(cfg)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n_params == sum(p.numel() for p in hf.parameters()) + 16 * 32
    # fp32 parameters and Adam's two moments are arguments of the step
    assert r["argument_bytes"] >= 3 * 4 * n_params
    scratch = build_program(load_config(ROOT / "configs" / "tiny.yaml"), "codebook", target_mesh(TARGETS["cpu"], one))
    assert any("from-scratch" in n for n in scratch.notes)


def test_h100_plans_the_ocr2_codebook_whose_decoder_rows_have_odd_length(tmp_path):
    """The OCR-2 decoder's rows are <bos>, N ids, the separator, the prompt and the targets: odd for every other
    canvas size (here 1 + 4 + 1 + 0 + 39). cuDNN's flash kernel (model.attention=auto, bf16 on a GPU) refuses a
    masked backward over odd lengths at trace time, so the stage itself would stop on a GPU; the plan compiles."""
    try:
        target_devices(TARGETS["h100"], 1)
    except TargetUnavailable as e:
        pytest.skip(f"h100 compiler not installed here ({e}); the plan-gpu extra provides it")
    from tests.hf_fixtures import save_tiny_ocr2

    save_tiny_ocr2(tmp_path / "ckpt", seed=0, small=True)
    ckpt = _config_only(tmp_path / "ckpt", tmp_path / "config_only", ("config.json", "tokenizer.json"))
    cfg = _ocr2_cfg(ckpt, "codebook.dtype=bfloat16", "codebook.ocr2_prompt=")
    r = plan.plan_once(cfg, "codebook", TARGETS["h100"], {"data": 1, "fsdp": 1, "tensor": 1})
    assert r["tokens_per_step"] == 8 * (4 + 40) and r["roofline_step_s"] > 0


def test_sft_plan_with_the_ocr2_decoder_as_the_dual_branch(tmp_path):
    # on a DeepSeek-OCR-2 codebook the branch is its MoE decoder (from config.json alone) behind a map from the
    # LM's width; its parameters are trainable beside the LM's
    from tests.hf_fixtures import save_tiny_ocr2

    save_tiny_ocr2(tmp_path / "ckpt", seed=0, small=True)
    ckpt = _config_only(tmp_path / "ckpt", tmp_path / "config_only", ("config.json", "tokenizer.json"))
    cfg = _ocr2_cfg(ckpt, *SMALL[:-1], "latent.dual_branch=on", "latent.source=codebook", "data.pack=false")
    one = {"data": 1, "fsdp": 1, "tensor": 1}
    from dlr_jax.plan.programs import build_program
    from dlr_jax.plan.targets import target_mesh

    prog = build_program(cfg, "sft", target_mesh(TARGETS["cpu"], one))
    batch = prog.args[3]
    assert batch["ocr_targets"].shape == (1, 16, 40) and batch["ocr_codes"].shape == (1, 16, 4)
    assert "with the dual-branch OCR decoder" in prog.notes
    # packed rows: the OCR fields per segment slot, as the packed pipeline feeds them (plan.totals.packed_ocr_step)
    slotted = build_program(cfg, "sft", target_mesh(TARGETS["cpu"], one), ocr_slots=2).args[3]
    assert slotted["ocr_targets"].shape == (1, 16, 2, 40) and slotted["ocr_segment_ids"].shape == (1, 16, 2)
    from flax import nnx

    trained = {"/".join(map(str, k)) for k, _ in nnx.to_flat_state(prog.args[0])}
    assert {"ocr/prefix_map", "ocr/projector", "ocr/view_separator"} <= trained
    assert any(k.startswith("ocr/text/moe/") for k in trained)


def test_sft_dual_branch_plan_follows_auto_as_the_stage_does(tmp_path):
    from dlr_jax.plan.programs import plans_dual_branch

    def branch(*extra):
        return plans_dual_branch(load_config(ROOT / "configs" / "tiny.yaml", [*SMALL[:-1], *extra]))

    # auto: on for codebook latents of a from-scratch codebook (its character decoder), off otherwise
    assert branch("latent.dual_branch=auto", "latent.source=codebook", "data.pack=false")
    assert not branch("latent.dual_branch=auto", "latent.source=random")
    ocr2 = ["codebook.init_from=/weights/ocr2", "latent.source=codebook", "data.pack=false"]
    assert branch("latent.dual_branch=auto", *ocr2) and branch("latent.dual_branch=on", *ocr2)  # D_ocr: OCR-2's
    # what sft refuses, the plan refuses; packed rows are accepted by both (one OCR row per segment)
    with pytest.raises(ConfigError, match="needs latent.source=codebook"):
        branch("latent.dual_branch=on", "latent.source=random")
    assert branch("latent.dual_branch=auto", *ocr2[:-1], "data.pack=true")
    assert branch("latent.dual_branch=auto", "latent.source=codebook", "data.pack=true")


def test_search_varies_the_codebook_s_own_remat_and_grad_accum(monkeypatch, cfg):
    tried = []

    def fake_plan(c, stage, target, mesh, lengths=None):
        tried.append((c.codebook.remat, c.codebook.train.grad_accum, c.model.remat))
        return {"fits": True, "roofline_step_s": 1.0}

    monkeypatch.setattr(plan, "plan_once", fake_plan)
    plan.search(cfg, "codebook", TARGETS["cpu"], 8)
    assert {t[0] for t in tried} == {"none", "dots", "full"} and {t[1] for t in tried} == {1, 2, 4, 8}
    assert {t[2] for t in tried} == {cfg.model.remat}  # the LM's remat is not the codebook's
