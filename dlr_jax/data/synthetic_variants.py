"""Evaluation-only variants of the synthetic task: the analogues of the paper's out-of-domain benchmarks.

    synthetic_hard      GSM-Hard's analogue: problems of the same shape with numbers 10x as large (the data
                        config's operands and values times HARD_SCALE), so the model meets numbers longer
                        than any it was trained on, as GSM-Hard swaps GSM8K's numbers for large ones.
    synthetic_reworded  SVAMP's analogue: the `synthetic` test problems themselves (same numbers, chain and
                        answer, paired one to one by id with the base-wording test split) told in the
                        reworded wording, which a base-wording run never trains on, with one irrelevant
                        sentence (another person's count of the same item) inserted, as SVAMP rewords MAWPS
                        problems and adds irrelevant quantities. A run trained with
                        `data.synthetic_wording=varied` has seen this wording (then it is in-domain).

A model trains on `synthetic` and is evaluated on these (`eval.benchmarks: [synthetic, synthetic_hard,
synthetic_reworded]`); they have test and valid splits only. Both follow the run's seed and the data
section's synthetic settings, as `synthetic` does.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

from dlr_jax.data.records import Example
from dlr_jax.data.synthetic import SyntheticConfig, restyle, synthetic_splits

HARD, REWORDED = "synthetic_hard", "synthetic_reworded"
VARIANTS: tuple[str, ...] = (HARD, REWORDED)
SPLITS = ("test", "valid")
HARD_SCALE = 10


def hard_config(cfg: SyntheticConfig) -> SyntheticConfig:
    """GSM-Hard's analogue of a task: operands and values HARD_SCALE times as large, the rest unchanged."""
    return dataclasses.replace(cfg, max_operand=cfg.max_operand * HARD_SCALE, max_value=cfg.max_value * HARD_SCALE)


def reword(ex: Example, *, seed: int, cfg: SyntheticConfig) -> Example:
    """`ex` (a synthetic problem) in the reworded wording with one distractor sentence; its chain and answer
    are unchanged. The distractor is drawn from its own stream (seed and id), so the problems stay those of
    `synthetic`'s split."""
    always = dataclasses.replace(cfg, wording="reworded", distractor_rate=1.0)
    out = restyle(ex, random.Random(f"{seed}/{ex.id}"), always)
    return dataclasses.replace(out, id=REWORDED + ex.id.removeprefix("synthetic"), source=REWORDED)


def variant_split(name: str, split: str, *, sizes: Mapping[str, int] | None = None, seed: int = 0,
                  config: SyntheticConfig | None = None) -> list[Example]:
    """Split `split` of variant `name`, for a run whose synthetic data is `config` with `seed` and `sizes`
    (the arguments `synthetic.synthetic_splits` takes)."""
    if name not in VARIANTS:
        raise ValueError(f"unknown synthetic variant {name!r}; known: {VARIANTS}")
    if split not in SPLITS:
        raise ValueError(f"{name} is for evaluation only: its splits are {SPLITS}, not {split!r}")
    base = config or SyntheticConfig()
    if name == HARD:
        examples = synthetic_splits(sizes, seed=seed, config=hard_config(base), only=[split])[split]
        return [dataclasses.replace(e, id=HARD + e.id.removeprefix("synthetic"), source=HARD) for e in examples]
    plain = dataclasses.replace(base, wording="base", distractor_rate=0.0)  # the base task's problems, then reworded
    examples = synthetic_splits(sizes, seed=seed, config=plain, only=[split])[split]
    return [reword(e, seed=seed, cfg=plain) for e in examples]
