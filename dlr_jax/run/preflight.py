"""Checks of a run's inputs that must pass before anything is written to the workdir.

- `check_counts(cfg)`: counts and intervals that must be >= 1 (steps, batch sizes, log/checkpoint
  intervals, group sizes...). A negative `num_steps` used to "train" 0 steps and save `final/`,
  `checkpoint_every=0` died with ZeroDivisionError after compiling.
- (Not here: `stages.common.check_init_from` checks the files of the `init_from` checkpoint a stage loads, and
  `stages.common.prepare_workdir` the SFT/RL split's size, before the stage writes anything.)
- The data: `dlr_jax.data.checks` (numeric golds, empty files) runs inside `load_benchmark`, and the
  stages read their data before they write anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from dlr_jax.config import Config, ConfigError
from dlr_jax.config.stages import TrainConfig

# Every TrainConfig in the tree (cfg.train.*, cfg.codebook.train): these fields must be >= 1.
TRAIN_COUNTS = ("batch_size", "grad_accum", "num_steps", "log_every", "checkpoint_every")
COUNTS = (
    "data.max_len", "data.synthetic_train",
    "tokenizer.vocab_size", "tokenizer.pad_multiple", "latent.num_latents", "latent.latent_dim",
    "eval.seeds", "eval.batch_size", "eval.max_new_tokens", "rl.num_prompts", "rl.group_size", "rl.inner_epochs",
    "rl.max_new_tokens", "rl.eval_every", "codebook.eval_batch_size", "sampling.max_new_tokens",
    "sampling.prompt_bucket",
)
def _train_configs(node: Any, prefix: str = "") -> Iterator[tuple[str, TrainConfig]]:
    if isinstance(node, TrainConfig):
        yield prefix.rstrip("."), node
        return
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            yield from _train_configs(getattr(node, f.name), f"{prefix}{f.name}.")


def _get(cfg: Any, dotted: str) -> Any:
    for k in dotted.split("."):
        cfg = getattr(cfg, k, None)
    return cfg


def check_counts(cfg: Config, steps: int | None = None) -> None:
    """Raises ConfigError listing every count/interval < 1 (and `--steps` < 1)."""
    bad = [f"{name}.{k}={getattr(tc, k)}" for name, tc in _train_configs(cfg) for k in TRAIN_COUNTS
           if getattr(tc, k) < 1]
    bad += [f"{k}={v}" for k in COUNTS if isinstance(v := _get(cfg, k), int) and v < 1]
    if steps is not None and steps < 1:
        bad.append(f"--steps {steps}")
    if bad:
        raise ConfigError(f"these counts and intervals must be >= 1: {', '.join(bad)}")


def check_train_config(cfg: TrainConfig, name: str, num_steps: int | None = None) -> None:
    """Counts and intervals that must be positive; a clear error before anything compiles."""
    bad = [f"{k}={getattr(cfg, k)}" for k in ("batch_size", "grad_accum", "log_every", "checkpoint_every")
           if getattr(cfg, k) < 1]
    steps = cfg.num_steps if num_steps is None else num_steps
    if steps < 1:
        bad.append(f"num_steps={steps}")
    if bad:
        raise ValueError(f"[{name}] must be >= 1: {', '.join(bad)}")
