"""A finished stage's model, handed on: saved by its stage, loaded back by the next stage, by
evaluation and by export.

`<workdir>/<stage>/final/` holds the params (Orbax) and meta.json: the stage, its `kind` and the
model config. Kinds: "backbone" (a text `Transformer`) and "latent_lm" (the backbone with latent
rows, `models.latent_lm.LatentLM`, sized from the workdir's tokenizer and the config's `latent:`
section). Below the stages and evaluation so that both, and the converter, read one format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import Config, ModelConfig, from_dict, to_dict
from dlr_jax.core.files import MissingStageError
from dlr_jax.core.sharding import mesh_from_config
from dlr_jax.run.checkpoint import read_meta, restore_params, save_params
from dlr_jax.run.workdir import final_dir, workdir_config
from dlr_jax.text.tokens import Tokenizer


def latent_rows_config(cfg: Config, tok: Tokenizer):
    """The latent rows (`models.latent_lm.LatentConfig`) that `cfg` and the tokenizer give."""
    from dlr_jax.models.latent_lm import LatentConfig as LatentRows

    return LatentRows.from_tokenizer(
        tok,
        cfg.latent.latent_dim,
        tie_projectors=cfg.latent.tie_projectors,
        codebook_trainable=cfg.latent.train_codebook_in_sft,
    )


def latent_lm_factory(model_cfg: ModelConfig, tok: Tokenizer, cfg: Config):
    from dlr_jax.models.latent_lm import build_latent_lm

    rows = latent_rows_config(cfg, tok)
    return lambda: build_latent_lm(model_cfg, rows)


def save_stage_model(
    model: nnx.Module,
    workdir: str | Path,
    stage: str,
    *,
    kind: str,
    model_cfg: ModelConfig,
    extra: dict[str, Any] | None = None,
) -> Path:
    meta = {"stage": stage, "kind": kind, "model": to_dict(model_cfg), **(extra or {})}
    return save_params(model, final_dir(workdir, stage), meta)


def _model_factory(meta: dict[str, Any], tok: Tokenizer, cfg: Config):
    """A builder of the (random, abstract-friendly) model that meta.json describes, to restore into."""
    from dlr_jax.models.transformer import Transformer

    mcfg = from_dict(ModelConfig, meta["model"])
    if meta["kind"] == "backbone":
        return lambda: Transformer(mcfg, rngs=nnx.Rngs(0))
    if meta["kind"] == "latent_lm":
        return latent_lm_factory(mcfg, tok, cfg)
    raise ValueError(f"unknown model kind {meta['kind']!r} in {meta}")


def restore_stage(workdir: str | Path, stage: str, tok: Tokenizer, cfg: Config, mesh: Mesh) -> nnx.Module:
    """The model a finished stage saved (its kind from meta.json), restored onto `mesh` with `cfg`'s rules."""
    d = final_dir(workdir, stage)
    if not (d / "meta.json").is_file():
        raise MissingStageError(f"{d}: stage {stage!r} has not finished in {workdir}; run "
                                f"`python -m dlr_jax.train --stage {stage} --workdir {workdir}` first")
    return restore_params(_model_factory(read_meta(d), tok, cfg), d, mesh, cfg.mesh.rules)


def load_stage_model(workdir: str | Path, stage: str, *, mesh: Mesh | None = None):
    """`(model, tokenizer, config)` of a finished stage, restored onto `mesh` (default: the config's)."""
    cfg = workdir_config(workdir)
    tok = Tokenizer.load(Path(workdir) / "tokenizer")
    model = restore_stage(workdir, stage, tok, cfg, mesh or mesh_from_config(cfg.mesh))
    return model, tok, cfg
