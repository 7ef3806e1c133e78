"""Stage export and LatentDecoder, on a random micro codebook model saved as the codebook stage would."""

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dlr_jax.config import ConfigError, load_config
from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.cot_view import cot_view
from dlr_jax.data.latents import latents_path, read_latents
from dlr_jax.data.sources import load_examples
from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model, jit_encode
from dlr_jax.rewards.process import LatentDecoder as LatentDecoderProtocol
from dlr_jax.run.checkpoint import save_params
from dlr_jax.run.workdir import final_dir
from dlr_jax.stages import common, export
from dlr_jax.stages.codebook.models import load_codebook_model, load_decoder
from dlr_jax.text import render
from dlr_jax.text.steps import split_steps
from tests.micro import codebook_nets

ROOT = Path(__file__).resolve().parents[2]
MICRO = [
    "codebook.max_side=192", "codebook.image_size=128", "codebook.max_text_len=24",
    *codebook_nets(num_queries=16),
    "latent.num_latents=32", "latent.latent_dim=16", "mesh.fsdp=1", "data.synthetic_train=20",
    "data.synthetic_eval=6", "data.synthetic_max_steps=6", "codebook.eval_batch_size=8",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO)
    w = tmp_path_factory.mktemp("ex")
    mcfg = CodebookModelConfig.from_config(cfg)
    model = build_codebook_model(mcfg, seed=0)
    save_params(model, final_dir(w, "codebook"), {"kind": "codebook", "model": mcfg.to_dict()})
    info = export.run(cfg, w)
    return cfg, w, model, info


def test_one_line_per_example_with_n_of_its_canvas(exported):
    cfg, w, model, info = exported
    assert set(info) == {"train", "test"} and (final_dir(w, "export") / "meta.json").is_file()
    rcfg = rp.render_config(cfg.codebook)
    for split, n_examples in (("train", 20), ("test", 6)):
        examples = load_examples(cfg, split)
        table = read_latents(latents_path(w, split), num_codes=32)
        assert len(table) == n_examples == len(examples) and list(table) == [ex.id for ex in examples]
        assert sum(info[split]["n_hist"].values()) == n_examples
        for ex in examples:
            side = render.render_cot_ex(ex.cot, config=rcfg).side  # the mean font size, as exported
            assert len(table[ex.id]) == (side // 64) ** 2
            assert table.example(ex.id).cot == ex.cot  # the source record travels with the ids
    assert len(set(info["train"]["n_hist"])) >= 2  # short and long CoTs: several canvas sizes


def test_ids_are_the_nearest_codes_of_the_rendered_image(exported):
    cfg, w, model, _ = exported
    ex = load_examples(cfg, "test")[0]
    img = np.asarray(render.render_cot_ex(ex.cot, config=rp.render_config(cfg.codebook)).image)[None, ..., 0]
    h = model.encode(jnp.asarray(img))
    expected = model.nearest(h)[0].tolist()
    assert read_latents(latents_path(w, "test"))[ex.id] == tuple(expected)


def test_latent_decoder_round_trip(exported):
    _, w, model, _ = exported
    dec = load_decoder(w, batch_size=4)
    assert isinstance(dec, LatentDecoderProtocol)
    codes = [list(range(n)) for n in range(1, 17)] + [[], [31, 0, 7]]  # any N from 1 to 16
    out = dec.decode(codes)
    assert len(out) == len(codes) and all(isinstance(s, str) for s in out) and out[16] == ""
    assert dec.decode(codes[::-1])[::-1] == out  # batching / order does not change a decoding
    assert dec.decode([codes[2]]) == [out[2]]
    limits = [0, 1, 3, 6]
    capped = dec.decode([[1, 2, 3]] * 4, limits=limits)
    assert capped[0] == "" and all(len(s) <= lim for s, lim in zip(capped, limits, strict=True))
    assert capped[3].startswith(capped[2]) and capped[2].startswith(capped[1])  # a cap cuts the same decoding
    with pytest.raises(ValueError, match="sequence 1 has codes \\[32\\]"):
        dec.decode([[0], [32]])
    with pytest.raises(ValueError, match="2 limits for 1 sequences"):
        dec.decode([[0]], limits=[3, 4])


def test_export_needs_a_codebook(tmp_path):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", MICRO)
    with pytest.raises(FileNotFoundError, match="--stage codebook"):
        export.run(cfg, tmp_path)


def test_export_encodes_the_configured_render_view(exported, tmp_path):
    _, _, model, _ = exported
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.render_view=results"])
    mcfg = CodebookModelConfig.from_config(cfg)
    meta = {"kind": "codebook", "model": mcfg.to_dict(), "codebook": {"render_view": "results"}}
    save_params(model, final_dir(tmp_path, "codebook"), meta)
    export.run(cfg, tmp_path)
    rcfg = rp.render_config(cfg.codebook)
    table = read_latents(latents_path(tmp_path, "test"))
    for ex in load_examples(cfg, "test")[:3]:
        shown = cot_view(ex.cot, "results")
        assert shown and "<<" not in shown
        img = np.asarray(render.render_cot_ex(shown, config=rcfg).image)[None, ..., 0]
        assert table[ex.id] == tuple(model.nearest(model.encode(jnp.asarray(img)))[0].tolist())
        assert table.example(ex.id).cot == ex.cot  # the record keeps the whole CoT for the LM stages


def test_export_refuses_a_codebook_trained_on_another_view(exported, tmp_path):
    _, w, _, _ = exported  # its codebook's meta predates the view: a `cot` codebook
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.render_view=results"])
    with pytest.raises(ValueError, match="trained with codebook.render_view=cot.*says results"):
        export.run(cfg, w)
    with pytest.raises(ConfigError, match="render_view must be one of cot|results|result_lines"):
        load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.render_view=resutls"])


def test_a_split_the_view_cannot_render_stops_export_before_any_is_written(exported, tmp_path, monkeypatch):
    _, _, model, _ = exported
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.render_view=results",
                                                        "codebook.export_splits=[valid]"])
    mcfg = CodebookModelConfig.from_config(cfg)
    save_params(model, final_dir(tmp_path, "codebook"),
                {"kind": "codebook", "model": mcfg.to_dict(), "codebook": {"render_view": "results"}})

    def without_steps_in_valid(c, split, *a, **k):  # an extra split whose CoTs carry no calculator step
        examples = load_examples(c, split, *a, **k)
        return [dataclasses.replace(ex, cot="twelve then ninety") for ex in examples] if split == "valid" else examples

    monkeypatch.setattr(export, "load_examples", without_steps_in_valid)
    with pytest.raises(ValueError, match="render_view=results: example .* has no calculator step"):
        export.run(cfg, tmp_path)
    assert not latents_path(tmp_path, "train").exists() and not latents_path(tmp_path, "test").exists()


STEP_MICRO = [  # render_unit=step: a short sentence on a 128 px canvas (4 codes), a longer one on 192 px (9 codes)
    *MICRO, "codebook.render_unit=step",
    "codebook.train.batch_size=8", "codebook.train.progress=false", "codebook.train.async_checkpointing=false",
    "codebook.train.checkpoint_every=100", "codebook.kmeans_init_batches=1", "codebook.kmeans_iters=1",
    "codebook.eval_examples=4", "codebook.alpha_steps=0", "codebook.warmup_steps=0", "codebook.dead_code_every=0",
    "data.synthetic_train=8", "data.synthetic_eval=4",
    "data.synthetic_cot_style=natural",
]


@pytest.fixture(scope="module")
def step_exported(exported, tmp_path_factory):
    """The micro model saved as a step codebook, exported with render_unit=step."""
    model = exported[2]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", STEP_MICRO)
    w = tmp_path_factory.mktemp("steps")
    meta = {"kind": "codebook", "model": CodebookModelConfig.from_config(cfg).to_dict(),
            "codebook": {"render_unit": "step"}}
    save_params(model, final_dir(w, "codebook"), meta)
    return cfg, w, export.run(cfg, w)


@pytest.mark.slow
def test_the_codebook_stage_trains_and_exports_single_steps(tmp_path):
    from dlr_jax.stages.codebook import stage as codebook

    cfg = load_config(ROOT / "configs" / "tiny.yaml", STEP_MICRO)
    report = codebook.run(cfg, tmp_path, num_steps=2)
    steps_of = {ex.id: split_steps(ex.cot) for ex in load_examples(cfg, "train")}
    # the codebook trained and was checked on single steps: one text a step of the corpus
    assert report["plan"]["examples"] == sum(map(len, steps_of.values())) > len(steps_of)
    assert report["held_out"]["examples"] == 4 and report["steps"] == 2
    export.run(cfg, tmp_path)
    table = read_latents(latents_path(tmp_path, "train"), num_codes=32)
    for ex_id, steps in steps_of.items():
        counts = table.step_counts(ex_id)
        assert len(counts) == len(steps) and sum(counts) == len(table[ex_id]) and set(counts) <= {4, 9}


def test_step_latents_are_each_steps_codes_in_order(step_exported):
    cfg, w, info = step_exported
    steps_of = {ex.id: split_steps(ex.cot) for ex in load_examples(cfg, "train")}
    model = load_codebook_model(w, common.make_mesh_for(cfg))  # as export loads it
    rcfg = rp.render_config(cfg.codebook)
    # each step on its own canvas at export's font (the mean), encoded directly: one encoder call a canvas side
    images = {(i, j): np.asarray(render.render_cot_ex(s, config=rcfg).image)[..., 0]
              for i, steps in enumerate(steps_of.values()) for j, s in enumerate(steps)}
    graphdef, state = nnx.split(model)
    codes, b = {}, cfg.codebook.eval_batch_size  # export's batch size: its compiled encoder is reused
    for side in {im.shape[0] for im in images.values()}:
        keys = [k for k, im in images.items() if im.shape[0] == side]
        for at in range(0, len(keys), b):
            part = np.stack([images[k] for k in keys[at:at + b]])
            part = np.concatenate([part, np.repeat(part[:1], b - len(part), 0)])
            ids = np.asarray(jit_encode(graphdef, state, jnp.asarray(part))[1])
            codes |= {k: z.tolist() for k, z in zip(keys[at:at + b], ids, strict=False)}
    table = read_latents(latents_path(w, "train"), num_codes=32)
    for i, (ex_id, steps) in enumerate(steps_of.items()):
        per_step = [codes[i, j] for j in range(len(steps))]
        assert table[ex_id] == tuple(c for z in per_step for c in z)
        assert table.step_counts(ex_id) == tuple(map(len, per_step)) == tuple(
            (images[i, j].shape[0] // 64) ** 2 for j in range(len(steps)))
        assert sum(table.step_counts(ex_id)) == len(table[ex_id])
    # both canvas sides occur, so the concatenation's boundaries are exercised
    assert {len(z) for z in codes.values()} == {4, 9}
    assert info["train"]["step_codes_hist"] == {n: sum(c == n for z in table for c in table.step_counts(z))
                                                for n in (4, 9)}


def test_step_latents_refuse_a_chain_codebook(step_exported):
    _, w, _ = step_exported
    with pytest.raises(ValueError, match="trained with codebook.render_unit=step.*says chain"):
        export.run(load_config(ROOT / "configs" / "tiny.yaml", MICRO), w)
    with pytest.raises(ConfigError, match="render_unit must be one of chain|step"):
        load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.render_unit=steps"])
