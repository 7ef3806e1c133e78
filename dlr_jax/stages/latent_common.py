"""Shared by the latent stages (align, sft, rl): latent ids per example and the latent LM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import Config
from dlr_jax.core.files import MissingStageError
from dlr_jax.data.latents import latents_path, random_latents, read_latents, step_result_latents
from dlr_jax.data.records import Example
from dlr_jax.data.sources import load_examples
from dlr_jax.run.handoff import restore_stage, save_stage_model
from dlr_jax.run.workdir import final_dir, stage_dir
from dlr_jax.stages import common
from dlr_jax.text.tokens import Tokenizer


def latents_for(cfg: Config, workdir: str | Path, split: str, examples: list[Example]) -> dict[str, Any]:
    """Latent code indices per example id: the export stage's file, or (latent.source=random) a
    fixed pseudo-random stand-in that carries no information (pipeline checks only), or
    (step_results) one code per CoT step holding its result (the perfect-codebook control)."""
    if cfg.latent.source == "random":
        return random_latents(examples, cfg.latent.num_latents, seed=cfg.run.seed)
    if cfg.latent.source == "step_results":
        return step_result_latents(examples, cfg.latent.num_latents)
    if cfg.latent.source != "codebook":
        raise ValueError(f"latent.source must be codebook, random or step_results, got {cfg.latent.source!r}")
    path = latents_path(workdir, split)
    if not path.is_file():
        raise MissingStageError(
            f"{path}: no latent ids. Run `python -m dlr_jax.train --stage export --workdir {workdir}` "
            "first (after --stage codebook), or set latent.source=random for a pipeline check."
        )
    table = read_latents(path, num_codes=cfg.latent.num_latents)
    missing = [ex.id for ex in examples if ex.id not in table]
    if missing:
        raise ValueError(
            f"{path}: {len(missing)} of {len(examples)} examples have no latent ids, e.g. {missing[:3]}"
        )
    return table


def stage_codebook(workdir: str | Path) -> np.ndarray | None:
    """The codebook stage's codebook [K, d_c], if that stage has run."""
    f = Path(workdir) / "codebook" / "codebook.npy"
    return np.load(f) if f.is_file() else None


def initial_codebook(codebook: np.ndarray | None, how: str) -> np.ndarray | None:
    """The LM's codebook at the start of align (`latent.codebook_init`): the stage's `codebook` [K, d_c] as it is
    ("stage"), z-scored per dimension over its K rows ("standardized"; a constant dimension stays 0), or None
    ("random": the LM draws N(0, 1) rows). None in, None out (no codebook stage: random rows either way)."""
    if codebook is None or how == "stage":
        return codebook
    if how == "random":
        return None
    if how != "standardized":
        raise ValueError(f"codebook_init must be stage, standardized or random, got {how!r}")
    c = np.asarray(codebook, np.float64)
    std = c.std(axis=0)
    return ((c - c.mean(axis=0)) / np.where(std > 0, std, 1.0)).astype(np.float32)


def load_backbone_for_latents(cfg: Config, workdir: str | Path, tok: Tokenizer, mesh: Mesh):
    """The backbone the latent stages start from: the HF checkpoint when `init_from` is set, else
    (tiny from-scratch configs) the CoT-SFT model of the textsft stage."""
    if cfg.init_from:
        return common.new_backbone(cfg, tok, mesh)
    d = final_dir(workdir, "textsft_cot")
    if not d.exists():
        raise MissingStageError(
            f"{d}: no CoT-SFT backbone. For from-scratch configs run "
            f"`python -m dlr_jax.train --stage textsft --mode cot --workdir {workdir}` first, or set init_from."
        )
    return restore_stage(workdir, "textsft_cot", tok, cfg, mesh)


def new_latent_lm(cfg: Config, workdir: str | Path, tok: Tokenizer, mesh: Mesh):
    from dlr_jax.models.latent_lm import LatentLM

    backbone = load_backbone_for_latents(cfg, workdir, tok, mesh)
    codebook = initial_codebook(stage_codebook(workdir), cfg.latent.codebook_init)
    kwargs: dict[str, Any] = dict(
        tie_projectors=cfg.latent.tie_projectors, codebook_trainable=cfg.latent.train_codebook_in_sft
    )
    return LatentLM.from_backbone(
        backbone,
        tok,
        codebook=codebook,
        latent_dim=None if codebook is not None else cfg.latent.latent_dim,
        rngs=nnx.Rngs(params=cfg.run.seed + 1),
        mesh=mesh if mesh.size > 1 else None,
        rules=cfg.mesh.rules,
        **kwargs,
    )


def load_latent_stage(cfg: Config, workdir: str | Path, stage: str, tok: Tokenizer, mesh: Mesh):
    return restore_stage(workdir, stage, tok, cfg, mesh)  # says which command makes a stage that is missing


def local_batch(batch_size: int) -> int:
    n = jax.process_count()
    if batch_size % n:
        raise ValueError(f"batch_size={batch_size} must divide by the number of processes ({n})")
    return batch_size // n


def train_latent_stage(cfg: Config, workdir: str | Path, stage: str, make_model, *, num_steps: int | None = None,
                       branch: Any = None, curriculum: Any = None):
    """The align / sft recipe: data with latent ids -> the stage's trainable filter -> Trainer ->
    `<workdir>/<stage>/final`. `make_model(cfg, workdir, tok, mesh)` gives the starting LatentLM.

    `branch` (stage sft's dual branch, `dlr_jax.stages.sft.DualBranch`) extends the recipe:
    `data_kwargs()` adds batch fields, `wrap(lm, trainable, mesh, rules)` gives the trained model,
    its loss and filter, `finish(model, step)` saves its extra outputs and returns the LatentLM that
    is saved and returned as usual. `curriculum` (stage sft's latent curriculum, `data.curriculum.Curriculum`)
    mixes latent and text steps in the rows; it learns the stage's length once the schedule is resolved."""
    import dataclasses
    import functools

    from dlr_jax.data.pipeline import make_stage_dataset
    from dlr_jax.models.latent_lm import filter_for_stage
    from dlr_jax.training.trainer import Trainer

    train = load_examples(cfg, cfg.data.train_split)  # the inputs validate before anything is written
    common.prepare_workdir(cfg, workdir, train)
    tok = common.get_tokenizer(cfg, workdir, train)
    # align reads data.align_part (the paper: the whole split, RL part too); sft the SFT part
    train = common.stage_examples(cfg, workdir, cfg.data.align_part if stage == "align" else "sft", tok, train)
    mesh = common.make_mesh_for(cfg)
    latents = latents_for(cfg, workdir, cfg.data.train_split, train)
    tcfg = getattr(cfg.train, stage)
    model = make_model(cfg, workdir, tok, mesh)
    data = make_stage_dataset(
        stage, train, tok, batch_size=local_batch(tcfg.batch_size), max_len=cfg.data.max_len,
        seed=cfg.run.seed, latents=latents, num_workers=cfg.data.num_workers,
        vocab_size=model.vocab_size, curriculum=curriculum, pad_to=cfg.data.pad_to,
        **(branch.data_kwargs() if branch is not None else {}),
        **common.data_kwargs(cfg, tcfg, mesh, len(train), num_steps),
    )
    tcfg, batch_examples = common.packed_batch(tcfg, data)  # data.pack_batch=examples: the rows the data chose
    # after the data: a packed epoch is fewer steps (its rows hold several examples each)
    tcfg = common.resolve_schedule(tcfg, len(train), workdir, stage, pack=data.pack if data.packed else None,
                                  batch_examples=batch_examples, pack_batch=data.pack_batch)
    data = data.schedule_curriculum(tcfg.num_steps)
    common.describe_rows(stage, data)
    loss = functools.partial(common.lm_loss, vocab_mask=model.vocab_mask(), reduction=tcfg.loss_reduction)
    trainable = filter_for_stage(stage, model.latent_cfg)
    if branch is not None:
        model, loss, trainable = branch.wrap(model, trainable, mesh, cfg.mesh.rules)
    # The OCR branch has its own gradient-norm budget: its gradients must not scale down the LM's steps.
    clip_group = (lambda path: "ocr" if "ocr" in path else "lm") if branch is not None else None
    trainer = Trainer(model, loss, tcfg, stage_dir(workdir, stage), mesh=mesh, rules=cfg.mesh.rules,
                      trainable=trainable, name=stage, clip_group=clip_group)
    result = trainer.fit(iter(data), num_steps)
    if not result.preempted:
        if branch is not None:
            result = dataclasses.replace(result, model=branch.finish(result.model, result.step))
        save_stage_model(result.model, workdir, stage, kind="latent_lm", model_cfg=result.model.model_cfg)
    return result
