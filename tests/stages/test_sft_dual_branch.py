"""Stage sft's dual branch: when it switches on, the batch fields, the combined loss against a hand
computation, the LM's zero gradient, and a micro run that resumes and saves a decoder RL can load.

The codebook stage's and align's outputs are written directly (an untrained micro codebook model
saved as stages/codebook.py saves it, fixed random latent ids, an untrained latent LM on that
codebook), so only sft itself runs."""

import json
import logging
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ConfigError, apply_overrides, load_config
from dlr_jax.core.sharding import make_mesh
from dlr_jax.data.cot_view import cot_view
from dlr_jax.data.items import Item, build_sequence, filter_by_length
from dlr_jax.data.latents import latents_path, write_latents
from dlr_jax.data.ocr_rows import OCR_KEYS
from dlr_jax.data.pipeline import make_stage_dataset
from dlr_jax.data.sources import load_examples
from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model
from dlr_jax.models.dual_branch import OCR_PARAMS, OCRBranch
from dlr_jax.models.latent_lm import build_latent_lm, filter_for_stage
from dlr_jax.run.checkpoint import read_meta, save_params
from dlr_jax.run.handoff import latent_rows_config, load_stage_model, save_stage_model
from dlr_jax.run.workdir import final_dir
from dlr_jax.stages import common, latent_common, sft
from dlr_jax.stages.codebook.models import decoder_dir, load_decoder, load_latent_decoder
from dlr_jax.text.ocr_text import VOCAB, encode_target
from tests.micro import codebook_nets

ROOT = Path(__file__).resolve().parents[2]
K = 16
MICRO = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.head_dim=16", "data.synthetic_train=64", "data.synthetic_eval=8",
    "data.max_len=96", "tokenizer.vocab_size=300", "tokenizer.pad_multiple=64", f"latent.num_latents={K}",
    "latent.latent_dim=16", "latent.source=codebook", "latent.dual_branch_weight=0.5", "mesh.fsdp=1",
    "codebook.max_side=128", "codebook.image_size=128", "codebook.max_text_len=64",
    *codebook_nets(num_queries=9),
    "codebook.char_dropout=0.25",
    "train.sft.batch_size=8", "train.sft.num_steps=30", "train.sft.log_every=1", "train.sft.progress=false",
    "train.sft.async_checkpointing=false", "train.sft.learning_rate=3e-3", "train.sft.checkpoint_every=1000",
]


def _cfg(*extra):
    return load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, *extra])


def _one():
    return make_mesh(1, 1, 1, devices=jax.devices()[:1])


def _write_codebook_meta(workdir, cfg, render_view="cot"):
    d = final_dir(workdir, "codebook")
    d.mkdir(parents=True)
    meta = {"kind": "codebook", "model": CodebookModelConfig.from_config(cfg).to_dict(),
            "codebook": {"render_view": render_view}}
    (d / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, compile_cache):
    """A workdir where codebook, export and align have (nominally) run."""
    cfg = _cfg()
    w = tmp_path_factory.mktemp("sftdb")
    common.prepare_workdir(cfg, w)
    train = load_examples(cfg, "train")
    tok = common.get_tokenizer(cfg, w, train)
    mcfg = CodebookModelConfig.from_config(cfg)
    cbm = build_codebook_model(mcfg, seed=0)
    meta = {"stage": "codebook", "kind": "codebook", "model": mcfg.to_dict()}
    save_params(cbm, final_dir(w, "codebook"), meta)
    np.save(w / "codebook" / "codebook.npy", np.asarray(cbm.vq.codebook[...]))
    rng = np.random.default_rng(0)
    table = {ex.id: rng.integers(0, K, rng.choice([4, 9])).tolist() for ex in train}  # N in {4, 9}, as exported
    write_latents(latents_path(w, "train"), train, table)
    rbg = nnx.Rngs(params=jax.random.key(0, impl="rbg"))  # far cheaper to init on a CPU than threefry
    lm = build_latent_lm(common.backbone_config(cfg, tok), latent_rows_config(cfg, tok), rngs=rbg)
    lm.set_codebook(cbm.vq.codebook[...])
    save_stage_model(lm, w, "align", kind="latent_lm", model_cfg=lm.model_cfg)
    return cfg, w, tok, train, table, cbm


# ----------------------------------------------------------------------------------------------
# When the branch is on.


def test_an_ocr2_codebook_makes_its_decoder_the_branch(tmp_path):
    """On a DeepSeek-OCR-2 codebook D_ocr is its fine-tuned MoE decoder: `auto` and `on` train it, with targets in
    the checkpoint's tokens (the tokenizer the codebook stage copied beside its params)."""
    from dlr_jax.models.ocr2 import ocr2_config_from_hf
    from dlr_jax.models.ocr2_codebook import PAD, Ocr2CodebookConfig
    from tests.hf_fixtures import build_tiny_ocr2, tiny_char_tokenizer

    ocfg = ocr2_config_from_hf(build_tiny_ocr2(small=True).config.to_dict())
    mcfg = Ocr2CodebookConfig(ocfg, K, max_text_len=12)
    d = final_dir(tmp_path, "codebook")
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"kind": "codebook", "model": mcfg.to_dict()}))
    tiny_char_tokenizer().save(str(d / "tokenizer.json"))
    for mode in ("auto", "on"):
        branch = sft.resolve_dual_branch(_cfg(f"latent.dual_branch={mode}"), tmp_path)
        assert branch is not None and branch.ocr2 and branch.decoder_cfg == mcfg
    kw = branch.data_kwargs()
    assert kw["ocr_text_len"] == 12 and kw["ocr_view"] == "cot"
    ids, cut = kw["ocr_encode"]("<<2*3=6>>", 12)
    want = tiny_char_tokenizer().encode("<<2*3=6>>", add_special_tokens=False).ids
    assert ids.tolist() == [*want, mcfg.eos_id, *[PAD] * (11 - len(want))] and not cut
    assert kw["ocr_encode"]("9" * 20, 12)[1]  # cut (the data pipeline counts it)
    assert sft.resolve_dual_branch(_cfg("data.pack=true"), tmp_path).ocr2  # packed rows: one OCR row a segment
    assert sft.resolve_dual_branch(_cfg("latent.dual_branch=off"), tmp_path) is None


def test_config_values():
    assert _cfg().latent.dual_branch == "auto"
    assert _cfg("latent.dual_branch=on").latent.dual_branch == "on"  # YAML reads bare on/off as booleans
    assert _cfg("latent.dual_branch=off").latent.dual_branch == "off"
    with pytest.raises(ConfigError, match="auto\\|on\\|off"):
        _cfg("latent.dual_branch=maybe")
    with pytest.raises(ConfigError, match="dual_branch_weight must be >= 0"):
        _cfg("latent.dual_branch_weight=-1")


def test_resolve(tmp_path):
    cfg = _cfg()
    assert sft.resolve_dual_branch(cfg, tmp_path) is None  # auto, no codebook stage: sft as before
    with pytest.raises(FileNotFoundError, match="codebook/final/meta.json.*--stage codebook"):
        sft.resolve_dual_branch(_cfg("latent.dual_branch=on"), tmp_path)
    _write_codebook_meta(tmp_path, cfg)
    branch = sft.resolve_dual_branch(cfg, tmp_path)
    assert branch is not None and branch.weight == 0.5 and branch.dropout == 0.25 and branch.reduction == "mean"
    assert sft.resolve_dual_branch(_cfg("train.sft.loss_reduction=sum"), tmp_path).reduction == "sum"
    assert branch.data_kwargs() == {"ocr_text_len": 64, "ocr_view": "cot"}
    # the decoder reads back what the codebook rendered, so the branch's targets follow the view
    with pytest.raises(ValueError, match="trained with codebook.render_view=cot"):  # not this codebook's view
        sft.resolve_dual_branch(_cfg("codebook.render_view=results"), tmp_path)
    w2 = tmp_path / "results_view"
    _write_codebook_meta(w2, cfg, render_view="results")
    assert sft.resolve_dual_branch(_cfg("codebook.render_view=results"), w2).data_kwargs()["ocr_view"] == "results"
    assert sft.resolve_dual_branch(_cfg("latent.dual_branch=off"), tmp_path) is None
    assert sft.resolve_dual_branch(_cfg("latent.source=random"), tmp_path) is None  # auto: random ids, off
    with pytest.raises(ValueError, match="needs latent.source=codebook"):
        sft.resolve_dual_branch(_cfg("latent.source=random", "latent.dual_branch=on"), tmp_path)
    # packed rows carry one OCR row per segment (tests/stages/test_packing.py)
    assert sft.resolve_dual_branch(_cfg("data.pack=true"), tmp_path) == branch


def test_a_step_codebook_branch_reads_one_step_a_row(tmp_path):
    cfg = _cfg("codebook.render_unit=step")
    d = final_dir(tmp_path, "codebook")
    d.mkdir(parents=True)
    meta = {"kind": "codebook", "model": CodebookModelConfig.from_config(cfg).to_dict(),
            "codebook": {"render_view": "cot", "render_unit": "step"}}
    (d / "meta.json").write_text(json.dumps(meta))
    # the pipeline's per-step targets (tests/data/test_ocr_rows.py), as the codebook trained its decoder
    assert sft.resolve_dual_branch(cfg, tmp_path).data_kwargs() == {"ocr_text_len": 64, "ocr_view": "cot",
                                                                    "ocr_unit": "step"}


def test_batches_carry_ocr_fields_and_resume(setup):
    cfg, _, tok, train, table, _ = setup
    kw = dict(batch_size=4, max_len=96, seed=0, latents=table, num_threads=0)
    ds = make_stage_dataset("sft", train, tok, ocr_text_len=64, **kw)
    it = iter(ds)
    batch = next(it)
    assert batch["ocr_targets"].shape == (4, 64) and batch["ocr_codes"].shape == batch["ocr_code_mask"].shape == (4, 9)
    by_tokens = {tuple(build_sequence("sft", tok, Item(ex, tuple(table[ex.id]))).tokens.tolist()): ex for ex in train}
    for r in range(4):
        ex = by_tokens[tuple(batch["tokens"][r][batch["segment_ids"][r] > 0].tolist())]  # the row's own example
        n = len(table[ex.id])
        assert batch["ocr_code_mask"][r].tolist() == [0] * (9 - n) + [1] * n  # left-padded
        assert batch["ocr_codes"][r, 9 - n :].tolist() == table[ex.id] and not batch["ocr_codes"][r, : 9 - n].any()
        np.testing.assert_array_equal(batch["ocr_targets"][r], encode_target(ex.cot, 64)[0])
    # codebook.render_view=results: the branch's targets are what that codebook rendered, the same rows
    viewed = next(iter(make_stage_dataset("sft", train, tok, ocr_text_len=64, ocr_view="results", **kw)))
    np.testing.assert_array_equal(viewed["tokens"], batch["tokens"])
    for r in range(4):
        ex = by_tokens[tuple(batch["tokens"][r][batch["segment_ids"][r] > 0].tolist())]
        np.testing.assert_array_equal(viewed["ocr_targets"][r], encode_target(cot_view(ex.cot, "results"), 64)[0])
    plain = next(iter(make_stage_dataset("sft", train, tok, **kw)))
    assert set(plain) == set(batch) - set(OCR_KEYS)  # off: the batch is unchanged
    for k in plain:
        np.testing.assert_array_equal(plain[k], batch[k])
    state = it.get_state()
    want = next(it)
    again = iter(make_stage_dataset("sft", train, tok, ocr_text_len=64, **kw))
    again.set_state(state)
    got = next(again)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    packed = next(iter(make_stage_dataset("sft", train, tok, ocr_text_len=64, pack=True, **kw)))
    slots = packed["ocr_segment_ids"].shape[1]  # one OCR row per segment (tests/stages/test_packing.py)
    assert packed["ocr_targets"].shape == (4, slots, 64) and packed["ocr_codes"].shape == (4, slots, 9)
    with pytest.raises(ValueError, match="needs stage 'sft'"):
        make_stage_dataset("align", train, tok, ocr_text_len=64, **kw)


def test_cut_ocr_targets_are_counted(setup, caplog):
    cfg, _, tok, train, table, _ = setup
    kw = dict(batch_size=4, max_len=96, seed=0, latents=table, num_threads=0)
    kept, _ = filter_by_length("sft", train, tok, max_len=96, latents=table)
    for text_len, want in ((8, sum(len(ex.cot) > 7 for ex in kept)), (512, 0)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dlr_jax.data.pipeline"):
            make_stage_dataset("sft", train, tok, ocr_text_len=text_len, **kw)
        assert f"{want} of {len(kept)} CoTs are longer than ocr_text_len - 1 = {text_len - 1}" in caplog.text
    assert want == 0 and sum(len(ex.cot) > 7 for ex in kept) > 0


# ----------------------------------------------------------------------------------------------
# The loss.


@pytest.fixture(scope="module")
def evaluated(setup):
    """The wrapped model as sft builds it, one batch, and in one compiled call: the dual-branch loss,
    the LM loss alone, and the gradient of the OCR term alone."""
    cfg, w, tok, train, table, _ = setup
    mesh = _one()
    lm = latent_common.load_latent_stage(cfg, w, "align", tok, mesh)
    branch = sft.resolve_dual_branch(cfg, w)
    model, _, trainable = branch.wrap(lm, filter_for_stage("sft", lm.latent_cfg), mesh, "fsdp")
    data = make_stage_dataset("sft", train, tok, batch_size=4, max_len=96, seed=1, latents=table, num_threads=0,
                              **branch.data_kwargs())
    batch = {k: jnp.asarray(v) for k, v in next(iter(data)).items()}
    vocab_mask = lm.vocab_mask()
    graphdef, params, rest = nnx.split(model, trainable, ...)

    @jax.jit
    def run(params, batch):
        def ocr_only(p):
            return sft.ocr_terms(nnx.merge(graphdef, p, rest), batch, jax.random.key(1), dropout=0.25)[0]

        m = nnx.merge(graphdef, params, rest)
        key = jax.random.key(0)
        return (sft.dual_branch_loss(m, batch, key, vocab_mask=vocab_mask, weight=0.5),
                common.lm_loss(m.lm, batch, key, vocab_mask=vocab_mask), jax.grad(ocr_only)(params))

    return model, params, batch, run(params, batch)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_is_lm_mean_plus_weighted_char_mean(evaluated):
    model, _, batch, ((total, count, met), (s_lm, n_lm, _), _) = evaluated
    # the OCR branch by hand: E_lat = C[z] W_in + b_in, then the decoder, log-softmax, mean over real chars
    c, wk, b = (np.asarray(x, np.float64) for x in (model.lm.codebook[...], model.lm.p_in.kernel[...],
                                                      model.lm.p_in.bias[...]))
    feats = c[np.asarray(batch["ocr_codes"])] @ wk + b
    targets = np.asarray(batch["ocr_targets"])
    inputs = np.concatenate([np.full((4, 1), VOCAB.BOS), targets[:, :-1]], 1)
    in_mask = np.concatenate([np.ones((4, 1), bool), targets[:, :-1] != VOCAB.PAD], 1)
    logits = nnx.jit(OCRBranch.decoder_logits)(model.ocr, jnp.asarray(feats, jnp.float32), jnp.asarray(inputs),
                                               jnp.asarray(in_mask), batch["ocr_code_mask"] > 0)
    logits = np.asarray(logits, np.float64)
    real = targets != VOCAB.PAD
    nll = -np.take_along_axis(_log_softmax(logits), targets[..., None], -1)[..., 0]
    ocr_mean = nll[real].mean()
    accuracy = (logits.argmax(-1) == targets)[real].mean()
    assert float(count) == float(n_lm) > 0
    np.testing.assert_allclose(total / count, s_lm / n_lm + 0.5 * ocr_mean, rtol=1e-5)
    np.testing.assert_allclose(met["ocr_ce"] / count, ocr_mean, rtol=1e-5)
    np.testing.assert_allclose(met["ocr_char_accuracy"] / count, accuracy, rtol=1e-5)
    np.testing.assert_allclose(met["lm_ce"], s_lm, rtol=1e-6)
    assert 0 < ocr_mean < 2 * np.log(VOCAB.size)


def test_ocr_loss_gradient_is_zero_on_every_lm_param(evaluated):
    _, params, _, (*_, grads) = evaluated
    paths = {"/".join(map(str, k)) for k, _ in nnx.to_flat_state(params)}
    assert {"ocr/prefix_proj", "lm/codebook", "lm/p_in/kernel"} <= paths  # the filter trains both branches
    assert any(p.startswith("ocr/decoder/") for p in paths) and any(p.startswith("lm/backbone/") for p in paths)
    grads = {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(grads)}
    assert set(grads) == paths
    for k, g in grads.items():
        if k.startswith("lm/"):
            assert not np.any(g), k
    assert np.any(grads["ocr/prefix_proj"]) and np.any(grads["ocr/decoder/embed"])


# ----------------------------------------------------------------------------------------------
# A run.


@pytest.fixture(scope="module")
def trained(setup):
    cfg, w, *_ = setup
    first = sft.run(cfg, w, num_steps=20)
    second = sft.run(cfg, w)  # resumes at step 20 (decoder params are in the trainer state)
    return first, second


def test_run_trains_the_decoder_and_resumes(setup, trained):
    cfg, w, *_ = setup
    first, second = trained
    assert first.step == 20 and second.step == 30
    rows = [json.loads(line) for line in (w / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))
    for r in rows:
        np.testing.assert_allclose(r["loss"], r["lm_ce"] + 0.5 * r["ocr_ce"], rtol=1e-4)
        assert 0 <= r["ocr_char_accuracy"] <= 1
    ce = [r["ocr_ce"] for r in rows]
    assert np.mean(ce[-5:]) < 0.8 * np.mean(ce[:5]), ce


def test_outputs_and_decoder_for_later_stages(setup, trained):
    cfg, w, tok, _, _, cbm = setup
    _, second = trained
    assert read_meta(w / "sft" / "final")["kind"] == "latent_lm"
    meta = read_meta(decoder_dir(w))
    assert meta["kind"] == "ocr_decoder" and meta["steps"] == 30 and meta["num_codes"] == K
    lm = load_stage_model(w, "sft", mesh=_one())[0]
    dec = load_decoder(w, batch_size=4)  # what RL's process reward gets, via load_latent_decoder
    assert isinstance(dec.model, OCRBranch)
    assert isinstance(load_latent_decoder(cfg, w).model, OCRBranch)
    # the frozen rows are the final sft model's E_lat(k), as the decoder saw them in training
    want = lm.embed_latents(jnp.arange(K)[None])[0]
    np.testing.assert_allclose(dec.model.vq.codebook[...], want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(dec.model.decoder.embed[...], cbm.decoder.embed[...])  # the decoder trained
    out = dec.decode([[1, 2, 3, 4], [5] * 9, []])
    assert len(out) == 3 and all(isinstance(s, str) for s in out) and out[2] == ""
    assert isinstance(second.model, type(lm))  # sft.run returns the latent LM, as without the branch


def test_flipping_the_branch_on_resume_is_a_clear_error(setup, trained):
    cfg, w, *_ = setup
    with pytest.raises(ValueError, match="written with the sft dual branch on"):
        sft.run(apply_overrides(cfg, ["latent.dual_branch=off"]), w)


def test_a_fresh_run_without_the_branch_moves_the_old_decoder_away(setup, trained, tmp_path):
    """Else the process reward would read latents with a decoder from a run that no longer exists."""
    cfg, w, *_ = setup
    wd = tmp_path / "w"
    shutil.copytree(w, wd)
    for old in ("checkpoints", "final", "events", "dual_branch.json"):  # a fresh sft run, the decoder left
        shutil.rmtree(wd / "sft" / old, ignore_errors=True)
        (wd / "sft" / old).unlink(missing_ok=True)
    assert decoder_dir(wd).is_dir()
    sft.run(apply_overrides(cfg, ["latent.dual_branch=off"]), wd, num_steps=1)
    assert not decoder_dir(wd).exists()
    assert len(list((wd / "sft").glob("decoder.stale-*"))) == 1  # moved, not deleted
    assert not isinstance(load_decoder(wd, batch_size=4).model, OCRBranch)  # the codebook's decoder


def test_run_on_packed_rows(setup, tmp_path):
    """data.pack=true with the branch: the stage trains on rows of several examples, each with its OCR row (the
    equality with padded rows: tests/stages/test_packing.py)."""
    cfg, w, *_ = setup
    wd = tmp_path / "w"
    shutil.copytree(w, wd, ignore=shutil.ignore_patterns("sft"))
    sft.run(apply_overrides(cfg, ["data.pack=true", "data.max_len=256"]), wd, num_steps=3)  # ~3 examples a row
    rows = [json.loads(line) for line in (wd / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for r in rows:
        assert r["sequences"] > 8 and r["ocr_ce"] > 0  # more examples than the 8 rows, each read back
        np.testing.assert_allclose(r["loss"], r["lm_ce"] + 0.5 * r["ocr_ce"], rtol=1e-4)
    assert read_meta(decoder_dir(wd))["kind"] == "ocr_decoder"


class _Stop(Exception):
    pass


def test_branch_clips_the_ocr_gradients_apart_from_the_lm(setup, trained, monkeypatch, tmp_path):
    """The trainer gets a clip_group that puts exactly the OCR branch's params (OCR_PARAMS) in their own
    gradient-norm group, so the decoder's gradients cannot shrink the LM's steps."""
    cfg, w, *_ = setup
    seen = {}

    from dlr_jax.training import trainer as trainer_mod
    from dlr_jax.training.optimizer import key_name

    class Recording(trainer_mod.Trainer):
        def __init__(self, model, loss, tcfg, workdir, **kw):
            seen["model"], seen["trainable"], seen["clip_group"] = model, kw["trainable"], kw["clip_group"]
            raise _Stop

    monkeypatch.setattr(trainer_mod, "Trainer", Recording)  # latent_common imports it when it runs
    wd = tmp_path / "w"
    shutil.copytree(w, wd)
    with pytest.raises(_Stop):
        sft.run(cfg, wd)
    group = seen["clip_group"]
    params = nnx.state(seen["model"], seen["trainable"])
    paths = lambda tree: [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]  # noqa: E731
    ocr = {jax.tree_util.keystr(p) for p in paths(nnx.state(seen["model"], OCR_PARAMS))}
    labels = {jax.tree_util.keystr(p): group(tuple(key_name(k) for k in p)) for p in paths(params)}
    assert ocr and {k for k, g in labels.items() if g == "ocr"} == ocr
    assert any(g == "lm" for g in labels.values())


def test_branch_marker_is_written_by_process_zero_only(tmp_path, monkeypatch):
    """Every process checks sft/dual_branch.json on resume while process 0 writes it: the other
    processes must not rewrite it (a truncated marker read as JSON failed a 2-process run)."""
    from dlr_jax.stages import sft
    monkeypatch.setattr(sft.jax, "process_index", lambda: 1)
    sft._check_branch_flip(tmp_path, True)
    assert not (tmp_path / "sft" / "dual_branch.json").exists()
    monkeypatch.setattr(sft.jax, "process_index", lambda: 0)
    sft._check_branch_flip(tmp_path, True)
    assert (tmp_path / "sft" / "dual_branch.json").read_text() == '{"on": true}\n'


def test_exact_packed_steps_train_what_padded_steps_train_with_the_branch(setup, tmp_path, capsys):
    """data.pack_batch=exact (the paper configs' default) with the branch: each step's examples packed, one OCR slot a
    segment; the stage's losses step for step are the padded run's (no character dropout: it draws its mask per OCR
    row, the same only in distribution)."""
    cfg, w, *_ = setup
    losses = {}
    for name, sets in (("padded", []), ("exact", ["data.pack=true", "data.pack_batch=exact"])):
        wd = tmp_path / name
        shutil.copytree(w, wd, ignore=shutil.ignore_patterns("sft"))
        sft.run(apply_overrides(cfg, [*sets, "data.max_len=256", "codebook.char_dropout=0"]), wd, num_steps=3)
        losses[name] = [json.loads(line) for line in (wd / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert re.search(r"\[sft\] packed: the 8 examples of a padded step in [1-7] rows of 256", capsys.readouterr().out)
    for key in ("loss", "lm_ce", "ocr_ce", "sequences"):
        np.testing.assert_allclose([r[key] for r in losses["exact"]], [r[key] for r in losses["padded"]], rtol=1e-5,
                                   err_msg=key)
