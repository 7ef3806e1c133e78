"""Checks of a run's inputs that must pass before anything is written to the workdir.

- `check_counts(cfg)`: counts and intervals that must be >= 1 (steps, batch sizes, log/checkpoint
  intervals, group sizes...). A negative `num_steps` used to "train" 0 steps and save `final/`,
  `checkpoint_every=0` died with ZeroDivisionError after compiling.
- `check_lengths(cfg)`: the codebook's smallest canvas gives every CoT at least (min_side / 64)^2 latent ids;
  when those and the boundary tokens alone overflow `data.max_len`, align and sft would drop every example
  (a 1024-px-only canvas makes 256 ids: none fits the paper's 256 tokens).
- `check_rates(cfg)`: learning rates finite and > 0 (0 where a recipe freezes a stage by design), loss and
  reward weights finite and >= 0.
- (Not here: `stages.common.check_init_from` checks the files of the `init_from` checkpoint a stage loads, and
  `stages.common.prepare_workdir` the SFT/RL split's size, before the stage writes anything.)
- The data: `dlr_jax.data.checks` (numeric golds, empty files) runs inside `load_benchmark`, and the
  stages read their data before they write anything.
"""

from __future__ import annotations

import dataclasses
import math
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
    if not (math.isfinite(cfg.learning_rate) and cfg.learning_rate >= 0):
        raise ValueError(f"[{name}] learning_rate={cfg.learning_rate} must be finite and >= 0")


# Tokens of an sft row besides the latents, the question and the answer: <bos> <latent> </latent> <answer>
# </answer> <eos> (`data.formats.sft_sequence`; align's [<bos> z y <eos>] needs fewer).
FIXED_TOKENS = 6
PATCH = 64  # canvas px per latent id along a side: N = (side / 64)^2


def check_lengths(cfg: Config) -> None:
    """Raises ConfigError when codebook latents alone leave no room in a training row: every CoT gets at least
    (codebook.min_side / 64)^2 ids, so with that many + FIXED_TOKENS >= data.max_len no example fits align or
    sft (they drop rows longer than data.max_len). Longer CoTs on larger canvases are dropped and counted
    there; this check is about the smallest canvas, which every example gets at least."""
    if cfg.latent.source != "codebook":
        return
    cb = cfg.codebook
    least = (cb.min_side // PATCH) ** 2
    if least + FIXED_TOKENS >= cfg.data.max_len:
        most = (cb.max_side // PATCH) ** 2
        raise ConfigError(
            f"codebook.min_side={cb.min_side} gives every CoT at least {least} latent ids (N = (side / 64)^2; "
            f"up to {most} at max_side={cb.max_side}); with {FIXED_TOKENS} boundary tokens that is >= "
            f"data.max_len={cfg.data.max_len}, so align and sft would drop every example. Size canvases per CoT "
            f"(codebook.min_side=64: the smallest multiple of 64 that holds it) or raise data.max_len"
        )


# Stages whose learning rate may be 0, because a recipe freezes them by design: align (the w/o-align ablation saves
# the freshly built latent LM through one step at 0, experiments/plan.py), sft (the w/o-SFT ablation saves align's
# model the same way, so RL starts right after align) and textsft_direct (the direct_from_cot control starts from
# the CoT-SFT model). Any other learning rate must be > 0: at 0 a stage trains nothing and saves final/ as if it had.
FREEZABLE = ("train.align", "train.sft", "train.textsft_direct")
# Loss and reward weights: 0 turns a term off; a negative one ascends it.
WEIGHTS = ("latent.dual_branch_weight", "codebook.lambda_vq", "codebook.beta", "codebook.router_aux_coef",
           "rl.beta", "rl.answer_weight", "rl.process_weight", "rl.format_weight")


def check_rates(cfg: Config) -> None:
    """Raises ConfigError listing every learning rate that is not finite and > 0 (>= 0 in FREEZABLE stages) and
    every weight of WEIGHTS that is not finite and >= 0. A negative learning rate trained to exit 0 and saved
    final/ as a finished stage; a NaN one was caught only by the non-finite-loss stop, after compiling."""
    bad = []
    for name, tc in _train_configs(cfg):
        lr, least = tc.learning_rate, 0.0 if name in FREEZABLE else None
        if not math.isfinite(lr) or lr < 0 or (least is None and lr == 0):
            bad.append(f"{name}.learning_rate={lr} (must be finite and {'>= 0' if least is not None else '> 0'})")
    for key in WEIGHTS:
        w = _get(cfg, key)
        if isinstance(w, int | float) and not (math.isfinite(w) and w >= 0):
            bad.append(f"{key}={w} (must be finite and >= 0)")
    if bad:
        raise ConfigError(f"out of range: {'; '.join(bad)}")
