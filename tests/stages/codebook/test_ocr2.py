"""Stage codebook from a tiny random deepseek_ocr2 checkpoint (codebook.init_from): trains with the
VQ after the causal flow, the OCR2 tokenizer's targets and the alpha curriculum, then stage export
writes each example's latent ids (the nearest codes of its rendered image)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.latents import latents_path, read_latents
from dlr_jax.data.sources import load_examples
from dlr_jax.models.ocr2_codebook import PAD, Ocr2CodebookModel
from dlr_jax.stages import export
from dlr_jax.stages.codebook import ocr2 as codebook_ocr2
from dlr_jax.stages.codebook import stage as codebook
from dlr_jax.stages.codebook.models import load_codebook_model
from dlr_jax.text import render
from tests.hf_fixtures import save_tiny_ocr2, tiny_char_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def _cfg(init_from: Path, *extra: str):
    return load_config(ROOT / "configs" / "tiny.yaml", [
        f"codebook.init_from={init_from}", "codebook.min_side=128", "codebook.max_side=128",
        "codebook.max_text_len=40", "latent.num_latents=16", "latent.latent_dim=32", "mesh.fsdp=1",
        "data.synthetic_train=32", "data.synthetic_eval=8", "codebook.train.batch_size=8",
        "codebook.train.progress=false", "codebook.train.async_checkpointing=false",
        "codebook.train.learning_rate=1e-3", "codebook.train.log_every=1", "codebook.train.checkpoint_every=100",
        "codebook.kmeans_init_batches=2", "codebook.kmeans_iters=1", "codebook.eval_examples=8",
        "codebook.eval_batch_size=8", "codebook.char_dropout=0", "codebook.warmup_steps=0",
        "codebook.alpha_steps=0", "codebook.dead_code_every=0", "codebook.train.num_steps=2", *extra,
    ])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ocr2ckpt")
    save_tiny_ocr2(d, seed=0, small=True)
    return d


def test_token_targets():
    tok = tiny_char_tokenizer()
    t = codebook_ocr2.token_targets(tok, ["ab  c", "x" * 20], 8, eos=1)
    assert t[0].tolist() == [*tok.encode("ab c", add_special_tokens=False).ids, 1, PAD, PAD, PAD]
    assert t[1, -1] == 1 and np.all(t[1, :-1] == tok.token_to_id("x"))  # cut to 7 tokens + <eos>


@pytest.mark.slow
def test_stage_from_ocr2_checkpoint_then_export(ckpt, tmp_path):
    cfg = _cfg(ckpt)
    report = codebook.run(cfg, tmp_path)
    assert report["steps"] == 2 and report["K"] == 16 and report["d_c"] == 32
    assert report["init"]["kmeans"] and report["init"]["features"] >= 16
    metrics = [json.loads(line) for line in (tmp_path / "codebook" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("ce_c" not in m for m in metrics)  # alpha_steps=0 (one compile); the alpha branch: below
    assert all(np.isfinite(m["ce_q"]) and 0 <= m["token_accuracy"] <= 1 for m in metrics)
    h = report["held_out"]
    assert h["examples"] == 8 and h["mean_n"] == 4.0 and 1 <= h["used_codes"] <= 16
    assert np.isfinite(h["ce_true"]) and np.isfinite(h["ce_shuffled"])

    model = load_codebook_model(tmp_path)
    assert isinstance(model, Ocr2CodebookModel) and model.cfg.quantize_at == "flow"
    np.testing.assert_array_equal(np.asarray(model.vq.codebook[...]), np.load(tmp_path / "codebook" / "codebook.npy"))
    # The pretrained weights were fine-tuned, not replaced: the loaded decoder still has the checkpoint's shapes.
    assert model.ocr2.text.embed[...].shape == (160, 64)

    info = export.run(cfg, tmp_path)
    table = read_latents(latents_path(tmp_path, "test"), num_codes=16)
    ex = load_examples(cfg, "test")[0]
    img = np.asarray(render.render_cot_ex(ex.cot, config=rp.render_config(cfg.codebook)).image)[None, ..., 0]
    want = jax.jit(lambda x: model.nearest(model.encode(x)))(jnp.asarray(img))[0].tolist()
    assert list(table[ex.id]) == want and len(want) == 4
    assert info["test"]["examples"] == 8


@pytest.mark.slow
def test_loss_alpha_branch_adds_alpha_times_the_continuous_ce(ckpt):
    """With `alpha` in the batch the loss is CE(H_st) + alpha * CE(H) + the VQ terms: the alpha
    branch equals the quantised-only loss plus alpha times the CE of the continuous features."""
    from flax import nnx

    from dlr_jax.convert.ocr2 import load_ocr2
    from dlr_jax.models.ocr2_codebook import Ocr2CodebookConfig

    ocfg, ocr2 = load_ocr2(ckpt)
    model = Ocr2CodebookModel(Ocr2CodebookConfig(ocfg, 16, 0.0, 24), rngs=nnx.Rngs(0))
    model.ocr2 = ocr2
    tok = tiny_char_tokenizer()
    texts = ["<<48/2=24>> 24 clips", "so 72 in total"]
    images = np.stack([np.asarray(render.render_cot_ex(t, font_size=17).image)[..., 0] for t in texts])
    targets = codebook_ocr2.token_targets(tok, texts, 24, eos=1)
    batch = {"images": jnp.asarray(images), "targets": jnp.asarray(targets)}
    rng = jax.random.key(0)
    graphdef, state = nnx.split(model)

    @jax.jit  # params as arguments: closed-over arrays would be folded as constants (slow compile)
    def losses(state, alpha):
        model = nnx.merge(graphdef, state)
        a, n, m = codebook_ocr2.ocr2_codebook_loss(model, batch | {"alpha": alpha}, rng, lambda_vq=0.25, beta=0.1)
        logits, _ = model.decoder_logits(model.encode(batch["images"]), batch["targets"])
        mask = batch["targets"] != PAD
        return a, n, m, jnp.sum(codebook_ocr2._nll(logits, batch["targets"]) * mask)

    a, n, m, ce_c = losses(state, jnp.full((2,), 0.3, jnp.float32))
    n = float(n)
    assert n == np.sum(targets != PAD) and float(ce_c) > 0
    np.testing.assert_allclose(float(m["ce_c"]), float(ce_c), rtol=1e-5)  # CE of the continuous H
    vq_terms = 0.25 * (float(m["vq"]) + 0.1 * float(m["commit"]))  # sums over tokens (x ntok)
    np.testing.assert_allclose(float(a), float(m["ce_q"]) + 0.3 * float(ce_c) + vq_terms, rtol=1e-5)
    assert float(m["ce_q"]) != float(ce_c)  # H_st is not H: the two branches are different inputs


def test_latent_dim_must_match_the_vq_width(ckpt, tmp_path):
    cfg = _cfg(ckpt, "latent.latent_dim=16")
    with pytest.raises(ConfigError, match="latent_dim"):
        codebook.run(cfg, tmp_path)


def test_the_fine_tuning_recipe_refuses_to_start_without_the_checkpoint(tmp_path):
    # configs/codebook-ocr2.yaml without codebook.init_from would train the from-scratch encoder at 1024 px with
    # no warm-up and no char dropout (not its recipe): the stage stops before writing anything, saying what to set
    from dlr_jax.plan import cli as plan
    from dlr_jax.plan.targets import TARGETS

    cfg = load_config(ROOT / "configs" / "codebook-ocr2.yaml")
    assert cfg.codebook.pretrained and not cfg.codebook.init_from
    with pytest.raises(ConfigError, match="needs it: --set codebook.init_from=DIR"):
        codebook.run(cfg, tmp_path / "w")
    assert not (tmp_path / "w").exists()
    with pytest.raises(ConfigError, match="planning the codebook stage needs it"):
        plan.plan_once(cfg, "codebook", TARGETS["cpu"], {"data": 1, "fsdp": 1, "tensor": 1})


def test_a_step_codebook_is_refused_on_the_checkpoint(tmp_path):
    # render_unit=step is built for the from-scratch encoder: on a checkpoint the stage stops before writing anything
    cfg = load_config(ROOT / "configs" / "codebook-ocr2.yaml",
                      [f"codebook.init_from={tmp_path / 'ckpt'}", "codebook.render_unit=step"])
    with pytest.raises(ConfigError, match="render_unit=step is not supported with codebook.init_from"):
        codebook.run(cfg, tmp_path / "w")
    assert not (tmp_path / "w").exists()
