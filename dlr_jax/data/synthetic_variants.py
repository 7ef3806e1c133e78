"""Evaluation-only variants of the synthetic task: the analogues of the paper's out-of-domain benchmarks.

    synthetic_hard      GSM-Hard's analogue: problems of the same shape with numbers 10x as large (the data
                        config's operands and values times HARD_SCALE), so the model meets numbers longer
                        than any it was trained on, as GSM-Hard swaps GSM8K's numbers for large ones.
    synthetic_reworded  SVAMP's analogue: the `synthetic` test problems themselves (same numbers, chain and
                        answer, paired one to one by id) told in wording the training data never uses, with
                        one irrelevant sentence (another person's count of the same item) inserted, as
                        SVAMP rewords MAWPS problems and adds irrelevant quantities.

A model trains on `synthetic` and is evaluated on these (`eval.benchmarks: [synthetic, synthetic_hard,
synthetic_reworded]`); they have test and valid splits only. Both follow the run's seed and the data
section's synthetic settings, as `synthetic` does.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

from dlr_jax.data.records import Example
from dlr_jax.data.synthetic import NAMES, SyntheticConfig, phrase, synthetic_splits

HARD, REWORDED = "synthetic_hard", "synthetic_reworded"
VARIANTS: tuple[str, ...] = (HARD, REWORDED)
SPLITS = ("test", "valid")
HARD_SCALE = 10

# As many templates per op as synthetic.STEP_TEMPLATES, so a story's template index picks one here too.
REWORDED_START = "At first {n} owns {a} {i}."
REWORDED_STEPS: Mapping[str, tuple[str, ...]] = {
    "+": ("{n} is given {b} extra {i}.", "{n} picks up another {b} {i}.", "{n} receives {b} additional {i}."),
    "-": ("{n} hands {b} {i} to a friend.", "{n} drops {b} of the {i}.", "{n} trades away {b} {i}."),
    "*": ("The number of {i} that {n} owns is multiplied by {b}.",),
    "/": ("{n} divides the {i} into {b} equal groups and keeps one group.",),
}
REWORDED_QUESTION = "What is the number of {i} {n} owns at the end?"
DISTRACTOR = "{m} has {c} {i}."


def hard_config(cfg: SyntheticConfig) -> SyntheticConfig:
    return dataclasses.replace(cfg, max_operand=cfg.max_operand * HARD_SCALE, max_value=cfg.max_value * HARD_SCALE)


def reword(ex: Example, *, seed: int, cfg: SyntheticConfig) -> Example:
    """`ex` (a synthetic problem) in the reworded phrasing with one distractor sentence; its chain and answer
    are unchanged. The distractor is drawn from its own stream (seed and id), so the problems stay those of
    `synthetic`'s split."""
    story = ex.extra
    rng = random.Random(f"{seed}/{ex.id}")
    sentences = phrase(story, REWORDED_START, REWORDED_STEPS, REWORDED_QUESTION)
    other = rng.choice([n for n in NAMES if n != story["name"]])
    at = rng.randint(1, len(sentences) - 1)  # after the opening sentence, before the question
    sentences.insert(at, DISTRACTOR.format(m=other, c=rng.randint(max(cfg.min_operand, 2), cfg.max_operand),
                                           i=story["item"]))
    return dataclasses.replace(ex, id=REWORDED + ex.id.removeprefix("synthetic"), question=" ".join(sentences),
                               source=REWORDED, extra={**story, "distractor_at": at})


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
    examples = synthetic_splits(sizes, seed=seed, config=base, only=[split])[split]
    return [reword(e, seed=seed, cfg=base) for e in examples]
