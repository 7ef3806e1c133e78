"""Stage export (the paper's latent id export): every example's latent ids z_1..z_N.

`run` renders each split's CoTs deterministically (the mean font size, so an example always gets
the same canvas), encodes them with the codebook stage's encoder and writes the plain nearest code
ids (no noise) to <workdir>/latents/<split>.jsonl (`dlr_jax.data.latents.write_latents`: id,
latents, n, and the source record). Splits: data.train_split, data.eval_split and
codebook.export_splits. <workdir>/export/final/meta.json records counts and code usage per split.
Under `codebook.render_unit=step` each step of a CoT is rendered and encoded on its own canvas, an
example's latents are its steps' codes in order, and the file's `steps` records the codes of each step.

Decoding ids back to text (`LatentDecoder`, `load_decoder`) lives in `stages/codebook_models.py`,
beside the codebook model's loaders that this stage, the codebook stage, sft and rl share.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dlr_jax.config import Config
from dlr_jax.core.files import MissingStageError, write_text_atomic
from dlr_jax.core.sharding import wait_for_all_processes
from dlr_jax.data import render_pipeline as rp
from dlr_jax.data.cot_view import render_texts
from dlr_jax.data.latents import latents_path, write_latents
from dlr_jax.data.records import Example
from dlr_jax.data.sources import load_examples
from dlr_jax.models.codebook_model import CodebookModel
from dlr_jax.models.vq import code_usage
from dlr_jax.run.workdir import final_dir
from dlr_jax.stages import common
from dlr_jax.stages.codebook.models import check_render_view, encode_ids, load_codebook_model
from dlr_jax.text import render

STAGE = "export"


def split_texts(cfg: Config, split: str) -> tuple[list[Example], list[list[str]]]:
    """A split's examples and the texts the codebook renders for each, one a canvas (`codebook.render_view`;
    the whole CoT, or each of its steps under `codebook.render_unit=step`)."""
    examples = load_examples(cfg, split)
    cb = cfg.codebook
    return examples, [render_texts(ex.cot, cb.render_view, cb.render_unit, example_id=ex.id) for ex in examples]


def encode_steps(model: CodebookModel, cfg: Config, texts: list[list[str]]
                 ) -> tuple[list[list[int]], list[list[int]], list[str], list[list[int]], float | None]:
    """Each example's canvases encoded in one pass: (latents per example [its canvases' codes in order], codes per
    canvas of each example, the canvases' texts, the canvases' codes, the encoder + VQ rate)."""
    flat = [t for ts in texts for t in ts]
    ids, _, rate = encode_ids(model, flat, cfg.codebook, num_workers=cfg.data.num_workers)
    latents, counts, at = [], [], 0
    for ts in texts:
        mine = ids[at:at + len(ts)]
        latents.append([c for z in mine for c in z])
        counts.append([len(z) for z in mine])
        at += len(ts)
    return latents, counts, flat, ids, rate


def export_split(model: CodebookModel, cfg: Config, workdir: str | Path, split: str,
                 examples: list[Example], texts: list[list[str]]) -> dict[str, Any]:
    ids, counts, canvases, canvas_ids, rate = encode_steps(model, cfg, texts)
    table = {ex.id: z for ex, z in zip(examples, ids, strict=True)}
    steps = ({ex.id: c for ex, c in zip(examples, counts, strict=True)} if cfg.codebook.render_unit == "step"
             else None)
    path = latents_path(workdir, split)
    if jax.process_index() == 0:  # every process computed the same ids; one writes them
        write_latents(path, examples, table, steps)
    flat = np.concatenate([np.asarray(z) for z in ids]) if ids else np.zeros(0, np.int32)
    _, used, ppl = code_usage(jnp.asarray(flat), model.cfg.num_codes)
    info = {"path": str(path), "examples": len(examples), "n_hist": dict(sorted(Counter(map(len, ids)).items())),
            "used_codes": int(used), "perplexity": float(ppl), "encoder_vq_images_per_s": rate,
            "overflow": overflow(canvases, canvas_ids, cfg)}
    if steps is not None:  # how many steps an example has, and how many codes a step gets
        info["steps_hist"] = dict(sorted(Counter(map(len, counts)).items()))
        info["step_codes_hist"] = dict(sorted(Counter(c for cs in counts for c in cs).items()))
    too_long = info["overflow"]["shrunk"] + info["overflow"]["truncated"]
    print(f"[export] {split}: {len(examples)} examples -> {path} (n histogram {info['n_hist']}, "
          f"{info['used_codes']} codes used, perplexity {info['perplexity']:.1f}; {too_long} CoTs too long for "
          f"the largest canvas, {cfg.codebook.max_side} px)", flush=True)
    return info


def overflow(texts: list[str], ids: list[list[int]], cfg: Config) -> dict[str, int]:
    """How many texts (CoTs, or steps) did not fit the largest canvas at export's font (the config's mean size):
    drawn with a smaller font (`shrunk`) or cut (`truncated`, codebook.overflow=truncate or below the smallest font).
    Only those on the largest canvas can have overflowed, so only they are laid out again."""
    rcfg = rp.render_config(cfg.codebook)
    largest = (rcfg.max_side // 64) ** 2
    font = render.sample_font_size(None, rcfg)
    laid = [rp.canvas_side(t, font, rcfg) for t, z in zip(texts, ids, strict=True) if len(z) == largest]
    return {"max_side": rcfg.max_side, "shrunk": sum(int(s and not t) for _, s, t in laid),
            "truncated": sum(int(t) for _, _, t in laid)}


def run(cfg: Config, workdir: str | Path, *, num_steps: int | None = None) -> dict[str, Any]:
    """Writes latents/<split>.jsonl for every split the later stages read. `num_steps` is unused
    (the CLI passes it to every stage)."""
    del num_steps
    if not (final_dir(workdir, "codebook") / "meta.json").is_file():
        raise MissingStageError(
            f"{final_dir(workdir, 'codebook')}: no trained codebook; run "
            f"`python -m dlr_jax.train --stage codebook --workdir {workdir}` first"
        )
    check_render_view(cfg, workdir)
    splits = list(dict.fromkeys([cfg.data.train_split, cfg.data.eval_split, *cfg.codebook.export_splits]))
    # every split's view before any is encoded: a split the view cannot render stops the stage with nothing written
    views = {s: split_texts(cfg, s) for s in splits}
    common.prepare_workdir(cfg, workdir)
    model = load_codebook_model(workdir, common.make_mesh_for(cfg))
    info = {s: export_split(model, cfg, workdir, s, *views[s]) for s in splits}
    d = final_dir(workdir, STAGE)
    d.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        write_text_atomic(d / "meta.json", json.dumps({"stage": STAGE, "kind": "latents", "splits": info}, indent=2))
    wait_for_all_processes("export done")  # the next stage reads the latents process 0 wrote, on every process
    return info
