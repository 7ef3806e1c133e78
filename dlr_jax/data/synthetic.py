"""Seeded synthetic multi-step arithmetic word problems in GSM8K-Aug format.

The default data for `make demo`: no download, a tiny vocabulary, and answers that need the chain
(each step acts on the previous result), so a small LM trained with the equation CoT can learn it
on a CPU while direct answering stays hard. One problem:

    question: "Tom has 3 apples. Tom buys 4 more apples. Tom then has 2 times as many apples.
               Tom gives away 5 apples. How many apples does Tom have now?"
    cot:      "<<3+4=7>> <<7*2=14>> <<14-5=9>>"
    answer:   "9"

`cot_style="natural"` tells the same chain in sentences with the annotations inline, as GSM8K's own
solutions do (GSM8K-Aug-NL's analogue): "Tom buys 4 more apples, so Tom has 3 + 4 = <<3+4=7>>7 apples. ..."

Every intermediate value stays in [0, max_value]; "/" is exact division only. Generation uses
Python's `random.Random(seed)`, so a seed gives the same problems on every machine.

CLI: `python -m dlr_jax.data.synthetic --out DIR [--train N --valid N --test N --seed S ...]`
writes DIR/{train,valid,test}.txt in GSM8K-Aug format (equation chains; that format has no natural one).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlr_jax.config.root import SYNTHETIC_COT_STYLES as COT_STYLES
from dlr_jax.data.gsm8k_aug import write_gsm8k_aug
from dlr_jax.data.records import Example

log = logging.getLogger(__name__)

NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Eva", "Leo", "Zoe")
ITEMS = ("apples", "books", "coins", "cards", "pens", "shells", "stamps", "marbles")
START = "{n} has {a} {i}."
STEP_TEMPLATES: Mapping[str, tuple[str, ...]] = {
    "+": ("{n} buys {b} more {i}.", "{n} finds {b} more {i}.", "{n} gets {b} more {i}."),
    "-": ("{n} gives away {b} {i}.", "{n} loses {b} {i}.", "{n} sells {b} {i}."),
    "*": ("{n} then has {b} times as many {i}.",),
    "/": ("{n} splits the {i} into {b} equal piles and keeps one pile.",),
}
QUESTION = "How many {i} does {n} have now?"
# A second wording (SVAMP's analogue: dlr_jax/data/synthetic_variants.py; `wording="varied"` mixes it into a task).
# As many templates per op as STEP_TEMPLATES, so a story's template index picks one in either wording.
REWORDED_START = "At first {n} owns {a} {i}."
REWORDED_STEPS: Mapping[str, tuple[str, ...]] = {
    "+": ("{n} is given {b} extra {i}.", "{n} picks up another {b} {i}.", "{n} receives {b} additional {i}."),
    "-": ("{n} hands {b} {i} to a friend.", "{n} drops {b} of the {i}.", "{n} trades away {b} {i}."),
    "*": ("The number of {i} that {n} owns is multiplied by {b}.",),
    "/": ("{n} divides the {i} into {b} equal groups and keeps one group.",),
}
REWORDED_QUESTION = "What is the number of {i} {n} owns at the end?"
# GSM8K-Aug-NL's analogue (`cot_style="natural"`): the chain told in sentences, each step's calculator annotation
# kept inline, as GSM8K's own solutions are ("Natalia sold 48/2 = <<48/2=24>>24 clips in May."). GSM8K's
# solutions are 6.6x the characters of their annotations joined (train split, means: 279 vs 42); these chains are
# 7.5x their equation form on the default 1-4-step task and 6.6x the equation form at 3-6 steps (the closing
# sentence weighs less).
# As many templates per op as STEP_TEMPLATES (the story's template index picks the verb of the question).
NATURAL_STEPS: Mapping[str, tuple[str, ...]] = {
    "+": ("{n} buys {b} more {i}, so {n} has {a} + {b} = {eq}{c} {i}.",
          "{n} finds {b} more {i}, so {n} has {a} + {b} = {eq}{c} {i}.",
          "{n} gets {b} more {i}, so {n} has {a} + {b} = {eq}{c} {i}."),
    "-": ("{n} gives away {b} {i}, so {n} has {a} - {b} = {eq}{c} {i} left.",
          "{n} loses {b} {i}, so {n} has {a} - {b} = {eq}{c} {i} left.",
          "{n} sells {b} {i}, so {n} has {a} - {b} = {eq}{c} {i} left."),
    "*": ("{n} then has {b} times as many {i}, which is {a} * {b} = {eq}{c} {i}.",),
    "/": ("{n} splits the {i} into {b} piles of {a} / {b} = {eq}{c} {i} and keeps one pile.",),
}
NATURAL_END = "So {n} has {c} {i} at the end."
DISTRACTOR = "{m} has {c} {i}."  # an irrelevant quantity: another person's count of the same item
WORDINGS = ("base", "reworded", "varied")  # varied: each sentence in either wording, at random
SPLIT_ORDER = ("test", "valid", "train")  # filled in this order: test/valid do not depend on train size
DEFAULT_SIZES: Mapping[str, int] = {"test": 500, "valid": 200, "train": 20000}


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """min/max_steps: number of equations per problem (uniform); operands are drawn from
    [min_operand, max_operand] (multipliers and divisors from max(2, min_operand)); ops is any
    subset of "+-*/"; every intermediate result stays in [0, max_value]."""

    min_steps: int = 1
    max_steps: int = 4
    min_operand: int = 1
    max_operand: int = 10
    ops: tuple[str, ...] = ("+", "-", "*")
    max_value: int = 200
    wording: str = "base"  # one of WORDINGS
    distractor_rate: float = 0.0  # share of problems with one irrelevant sentence (DISTRACTOR)
    cot_style: str = "equations"  # one of COT_STYLES: GSM8K-Aug's equation chain, or `natural_chain`'s sentences

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if not 0 <= self.min_operand <= self.max_operand:
            raise ValueError(
                f"need 0 <= min_operand <= max_operand, got {self.min_operand}, {self.max_operand}"
            )
        if not self.ops or set(self.ops) - set(STEP_TEMPLATES):
            raise ValueError(f"ops must be a non-empty subset of {tuple(STEP_TEMPLATES)}, got {self.ops!r}")
        if self.max_value < self.max_operand:
            raise ValueError(f"max_value={self.max_value} must be >= max_operand={self.max_operand}")
        if self.wording not in WORDINGS:
            raise ValueError(f"wording must be one of {WORDINGS}, got {self.wording!r}")
        if self.cot_style not in COT_STYLES:
            raise ValueError(f"cot_style must be one of {COT_STYLES}, got {self.cot_style!r}")
        if not 0.0 <= self.distractor_rate <= 1.0:
            raise ValueError(f"distractor_rate must be in [0, 1], got {self.distractor_rate}")

    @property
    def plain(self) -> bool:
        """Problems told in the base wording with no distractor: `generate_problem`'s text as it is."""
        return self.wording == "base" and self.distractor_rate == 0


def _operand_choices(op: str, v: int, cfg: SyntheticConfig) -> list[int]:
    """Operands b for which `v op b` is a valid step (integer, within [0, max_value], not trivial)."""
    lo, hi = cfg.min_operand, cfg.max_operand
    if op == "+":
        return list(range(max(lo, 1), min(hi, cfg.max_value - v) + 1))
    if op == "-":
        return list(range(max(lo, 1), min(hi, v) + 1))
    if op == "*":
        return [b for b in range(max(lo, 2), hi + 1) if v * b <= cfg.max_value] if v > 0 else []
    return [b for b in range(max(lo, 2), hi + 1) if v > 0 and v % b == 0]  # "/": exact only


def _apply(op: str, a: int, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]


def phrase(story: Mapping[str, Any], reworded: bool | Sequence[bool] = False) -> list[str]:
    """The sentences of a problem's `story` (an Example's `extra`: name, item, start value, and per step
    its op, operand and template index); the question is the last sentence. `reworded`: the reworded
    wording for every sentence, or per sentence (opening, steps, question)."""
    n, i = story["name"], story["item"]
    flags = list(reworded) if isinstance(reworded, Sequence) else [reworded] * (len(story["ops"]) + 2)
    if len(flags) != len(story["ops"]) + 2:
        raise ValueError(f"need {len(story['ops']) + 2} wording flags (opening, steps, question), got {len(flags)}")
    out = [(REWORDED_START if flags[0] else START).format(n=n, a=story["start"], i=i)]
    out += [(REWORDED_STEPS if r else STEP_TEMPLATES)[op][t].format(n=n, b=b, i=i)
            for op, b, t, r in zip(story["ops"], story["operands"], story["templates"], flags[1:-1], strict=True)]
    return [*out, (REWORDED_QUESTION if flags[-1] else QUESTION).format(n=n, i=i)]


def natural_chain(story: Mapping[str, Any]) -> str:
    """The chain of a problem's `story` in sentences (GSM8K's solution style), one a step with the step's
    calculator annotation inline, then a closing sentence: the same steps, results and answer as the equation
    chain, whose annotations are the `<<...>>` here in order."""
    n, i, a = story["name"], story["item"], story["start"]
    out = []
    for op, b, t in zip(story["ops"], story["operands"], story["templates"], strict=True):
        c = _apply(op, a, b)
        out.append(NATURAL_STEPS[op][t].format(n=n, i=i, a=a, b=b, c=c, eq=f"<<{a}{op}{b}={c}>>"))
        a = c
    return " ".join([*out, NATURAL_END.format(n=n, c=a, i=i)])


def restyle(ex: Example, rng: random.Random, cfg: SyntheticConfig) -> Example:
    """`ex` (a generated problem) told in `cfg.wording`, with one irrelevant sentence inserted with probability
    `cfg.distractor_rate`; its chain and answer are unchanged. Draws only from `rng`, so the problems
    themselves stay those of the base task."""
    story = ex.extra
    n = len(story["ops"]) + 2
    flags = [rng.random() < 0.5 for _ in range(n)] if cfg.wording == "varied" else [cfg.wording == "reworded"] * n
    sentences = phrase(story, flags)
    extra = {**story, "reworded": flags}
    rate = cfg.distractor_rate
    if rate >= 1 or (rate > 0 and rng.random() < rate):
        other = rng.choice([m for m in NAMES if m != story["name"]])
        at = rng.randint(1, len(sentences) - 1)  # after the opening sentence, before the question
        low = max(cfg.min_operand, 2)  # "has 1 apples" reads wrong
        count = rng.randint(low, max(cfg.max_operand, low))
        sentences.insert(at, DISTRACTOR.format(m=other, c=count, i=story["item"]))
        extra["distractor_at"] = at
    return dataclasses.replace(ex, question=" ".join(sentences), extra=extra)


def generate_problem(rng: random.Random, cfg: SyntheticConfig, *, example_id: str = "synthetic") -> Example:
    """One problem drawn from `rng` (advances it). Its `extra` keeps the story (see `phrase`), from which
    `dlr_jax.data.synthetic_variants` rewords it."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    n_steps = rng.randint(cfg.min_steps, cfg.max_steps)
    while True:  # restart on a dead end (no op has a valid operand); rare with sane configs
        value = start = rng.randint(max(cfg.min_operand, 1), cfg.max_operand)
        equations, ops, operands, templates = [], [], [], []
        for _ in range(n_steps):
            options = {op: _operand_choices(op, value, cfg) for op in cfg.ops}
            feasible = [op for op in cfg.ops if options[op]]
            if not feasible:
                break
            op = rng.choice(feasible)
            b = rng.choice(options[op])
            new = _apply(op, value, b)
            templates.append(rng.randrange(len(STEP_TEMPLATES[op])))  # the same draw as rng.choice(templates)
            equations.append(f"<<{value}{op}{b}={new}>>")
            ops.append(op)
            operands.append(b)
            value = new
        if len(equations) == n_steps:
            break
    story = {"steps": n_steps, "ops": ops, "name": name, "item": item, "start": start, "operands": operands,
             "templates": templates}
    return Example(
        id=example_id,
        question=" ".join(phrase(story)),
        # the natural chain draws nothing: the same problems as the equation style, told step by step
        cot=natural_chain(story) if cfg.cot_style == "natural" else " ".join(equations),
        answer=str(value),
        source="synthetic",
        extra=story,
    )


def generate(n: int, *, seed: int = 0, config: SyntheticConfig | None = None) -> list[Example]:
    """n problems from `random.Random(seed)`; duplicates are possible (see `synthetic_splits`)."""
    cfg = config or SyntheticConfig()
    rng = random.Random(seed)
    return [generate_problem(rng, cfg, example_id=f"synthetic/{seed}/{i}") for i in range(n)]


def synthetic_splits(
    sizes: Mapping[str, int] | None = None,
    *,
    seed: int = 0,
    config: SyntheticConfig | None = None,
    only: Sequence[str] | None = None,
    max_tries_factor: int = 50,
) -> dict[str, list[Example]]:
    """Disjoint splits (no problem in two splits or twice in one) from one seeded stream. A config that
    rewords problems or adds distractors (`plain` False) tells the same problems differently.

    Splits are filled in the order test, valid, train, so the test and valid problems do not
    change when the train size does. `only` stops once those splits are full (the earlier ones in
    the order are still generated, to keep them disjoint). Rejected duplicates are counted in the
    log. RuntimeError if the config's problem space is too small for the sizes asked.
    """
    cfg = config or SyntheticConfig()
    sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
    unknown = set(sizes) - set(SPLIT_ORDER)
    if unknown:
        raise ValueError(f"unknown synthetic split(s) {sorted(unknown)}; known: {SPLIT_ORDER}")
    order = [s for s in SPLIT_ORDER if s in sizes]
    if only is not None:
        missing = [s for s in only if s not in sizes]
        if missing:
            raise ValueError(f"split(s) {missing} not in sizes {sizes}")
        last = max(order.index(s) for s in only)
        order = order[: last + 1]
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[Example]] = {}
    duplicates = 0
    budget = max_tries_factor * max(1, sum(sizes[s] for s in order))
    for split in order:
        items: list[Example] = []
        while len(items) < sizes[split]:
            if budget == 0:
                raise RuntimeError(
                    f"could not draw {sizes[split]} distinct {split!r} problems (got {len(items)}, "
                    f"{duplicates} duplicates rejected); widen the config {cfg}"
                )
            budget -= 1
            ex = generate_problem(rng, cfg, example_id=f"synthetic/{split}/{len(items)}")
            if ex.question in seen:  # the base wording: a reworded repeat is still the same problem
                duplicates += 1
                continue
            seen.add(ex.question)
            if not cfg.plain:  # the wording from its own stream: the problems stay the base task's
                ex = restyle(ex, random.Random(f"{seed}/{ex.id}"), cfg)
            items.append(ex)
        out[split] = items
    log.info(
        "synthetic: %s problems, %d duplicate draws rejected (seed %d)",
        {k: len(v) for k, v in out.items()},
        duplicates,
        seed,
    )
    return out


def write_splits(out_dir: str | Path, splits: Mapping[str, list[Example]]) -> dict[str, int]:
    """Writes `out_dir/<split>.txt` in GSM8K-Aug format; returns the counts written."""
    out_dir = Path(out_dir)
    return {split: write_gsm8k_aug(exs, out_dir / f"{split}.txt") for split, exs in splits.items()}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for train.txt / valid.txt / test.txt")
    p.add_argument("--train", type=int, default=DEFAULT_SIZES["train"])
    p.add_argument("--valid", type=int, default=DEFAULT_SIZES["valid"])
    p.add_argument("--test", type=int, default=DEFAULT_SIZES["test"])
    p.add_argument("--seed", type=int, default=0)
    d = SyntheticConfig()
    p.add_argument("--min-steps", type=int, default=d.min_steps)
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--min-operand", type=int, default=d.min_operand)
    p.add_argument("--max-operand", type=int, default=d.max_operand)
    p.add_argument("--max-value", type=int, default=d.max_value)
    p.add_argument("--ops", default="".join(d.ops), help="subset of '+-*/' ('/' = exact division)")
    a = p.parse_args(argv)
    cfg = SyntheticConfig(
        min_steps=a.min_steps,
        max_steps=a.max_steps,
        min_operand=a.min_operand,
        max_operand=a.max_operand,
        ops=tuple(a.ops),
        max_value=a.max_value,
    )
    splits = synthetic_splits({"test": a.test, "valid": a.valid, "train": a.train}, seed=a.seed, config=cfg)
    for split, n in write_splits(a.out, splits).items():
        print(f"wrote {n} {split} problems to {Path(a.out) / f'{split}.txt'}")


if __name__ == "__main__":
    main()
