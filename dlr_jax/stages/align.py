"""Stage 1 — alignment: the backbone is frozen; only the projectors P_in / P_out learn to map
codebook rows into the LM's embedding space. Sequence `[z ; y]` (latents, then the CoT text), CE
on every target. The backbone is the HF checkpoint (`init_from`) or, for from-scratch configs, the
CoT-SFT model."""

from __future__ import annotations

from pathlib import Path

from dlr_jax.config import Config
from dlr_jax.stages.latent_common import new_latent_lm, train_latent_stage
from dlr_jax.training.trainer import TrainResult


def run(cfg: Config, workdir: str | Path, *, num_steps: int | None = None) -> TrainResult:
    return train_latent_stage(cfg, workdir, "align", new_latent_lm, num_steps=num_steps)
