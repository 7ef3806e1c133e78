"""The RL stage's other models and reward wiring: the frozen evaluator LM of the
process reward (its OCR decoder is `codebook_models.load_latent_decoder`), and users' registered
rewards (`rl.extra_rewards`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import Config, ModelConfig, from_dict
from dlr_jax.run.workdir import final_dir
from dlr_jax.text.tokens import Tokenizer


def extra_reward_weights(rl: Any) -> dict[str, float]:
    """`rl.extra_rewards` ("name=weight" entries) as {name: weight}, after importing
    `rl.reward_modules`; every name must be registered (dlr_jax.rewards.answer_format.register_reward)."""
    import importlib

    from dlr_jax.rewards.answer_format import get_reward

    for mod in rl.reward_modules:
        importlib.import_module(mod)
    out: dict[str, float] = {}
    for entry in rl.extra_rewards:
        name, sep, w = str(entry).partition("=")
        try:
            weight = float(w)
        except ValueError:
            weight = None
        if not sep or not name.strip() or weight is None:
            raise ValueError(f"rl.extra_rewards entry {entry!r} must look like name=weight (e.g. brevity=0.5)")
        name = name.strip()
        if name in ("answer", "format", "process"):
            raise ValueError(f"rl.extra_rewards: {name!r} is built in; set rl.{name}_weight instead")
        get_reward(name)  # unknown names fail here, listing the registered ones
        out[name] = weight
    return out


def load_evaluator(cfg: Config, workdir: str | Path, tok: Tokenizer, mesh: Mesh):
    """The frozen evaluator LM of r_proc (`rl.evaluator`): "backbone" = the model before alignment;
    else a workdir stage name or a `final/` directory holding a text backbone."""
    from dlr_jax.models.transformer import Transformer
    from dlr_jax.run.checkpoint import read_meta, restore_params
    from dlr_jax.stages.latent_common import load_backbone_for_latents

    spec = cfg.rl.evaluator
    if spec == "backbone":
        return load_backbone_for_latents(cfg, workdir, tok, mesh)
    d = Path(spec) if (Path(spec) / "meta.json").is_file() else final_dir(workdir, spec)
    meta = read_meta(d)
    if meta.get("kind") != "backbone":
        raise ValueError(f"{d}: rl.evaluator must be a text backbone checkpoint, found kind={meta.get('kind')!r}")
    mcfg = from_dict(ModelConfig, meta["model"])
    return restore_params(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)), d, mesh, cfg.mesh.rules)
