"""The examples a config names: `load_examples(cfg, split)` (the data section's dataset; `rl_split_for`: its
SFT/RL split's size on what was read) and `corpus(cfg)` / `corpus_texts(cfg)` (the codebook stage's CoT corpus:
a mixture of sources, each whole or a stratified sample, "name:split@N"). Shared by the stages, evaluation and
the render-cache CLI, so none of them reaches into another for its inputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dlr_jax.config import Config, ConfigError
from dlr_jax.data.cot_view import render_texts
from dlr_jax.data.readers import BENCHMARKS, load_benchmark, stand_in_read
from dlr_jax.data.records import Example


def load_examples(cfg: Config, split: str, benchmark: str = "synthetic") -> list[Example]:
    """Split `split` of the config's dataset, or "name:split" of another benchmark (from the data root; e.g.
    `data.eval_split: math500:test` beside `math_train`, which has only a train split). For a synthetic dataset,
    `benchmark` may name one of its evaluation-only variants (`synthetic_hard`, `synthetic_reworded`), drawn from
    the same settings and seed."""
    d = cfg.data
    if d.dataset == "synthetic":
        from dlr_jax.data.synthetic import SyntheticConfig

        sizes = {"train": d.synthetic_train, "valid": min(200, d.synthetic_eval), "test": d.synthetic_eval}
        return load_benchmark(
            benchmark,
            split=split,
            sizes=sizes,
            seed=cfg.run.seed,
            config=SyntheticConfig(min_steps=d.synthetic_min_steps, max_steps=d.synthetic_max_steps,
                                   max_operand=d.synthetic_max_operand, max_value=d.synthetic_max_value,
                                   wording=d.synthetic_wording, distractor_rate=d.synthetic_distractor_rate,
                                   cot_style=d.synthetic_cot_style),
        )
    if benchmark != "synthetic":
        raise ValueError(f"{benchmark} is a variant of the synthetic task; this config's dataset is {d.dataset!r}")
    if ":" in split:  # another benchmark's split, e.g. MATH-500 held out beside the MATH training set
        return load_named_split(split, "data split")
    if d.dataset == "gsm8k":  # DataConfig refuses gsm8k_cot for any other dataset
        return load_benchmark(d.dataset, path=d.path, split=split, cot=d.gsm8k_cot)
    return load_benchmark(d.dataset, path=d.path, split=split)


def rl_split_for(cfg: Config, train: Sequence[Example]) -> tuple[float, dict[str, Any] | None]:
    """data.rl_split as it applies to `train`, the examples read for data.train_split, and a note for the data
    protocol's record when it was changed. A count meant for the full release (the paper's 85,620 of GSM8K-Aug's
    385,620) that does not fit the smaller stand-in read because the full file is missing (readers.STAND_INS: the
    3,000-line subset) becomes the same fraction of the stand-in: a try-out on the subset keeps the recipe's
    proportions instead of stopping. Otherwise (data.rl_split, None): the full data is split exactly as the recipe
    says, and a count too large for a file the user chose stays an error (protocol.rl_count)."""
    d = cfg.data
    count = int(d.rl_split)
    if d.rl_split < 1 or d.rl_split != count or count < len(train) or d.dataset not in BENCHMARKS:
        return d.rl_split, None
    stand_in = stand_in_read(d.dataset, d.train_split, train)
    full = BENCHMARKS[d.dataset].counts.get(d.train_split, 0)
    if stand_in is None or not count < full:
        return d.rl_split, None
    fraction = count / full
    return fraction, {"configured": count, "of_full": full, "read": f"{d.dataset}:{stand_in}", "fraction": fraction}


def load_named_split(spec: str, what: str = "entry") -> list[Example]:
    """The examples of a "name:split" entry (e.g. gsm8k:train), from the data root; `what` names the setting
    in the error for a malformed entry."""
    name, sep, split = spec.partition(":")
    if not sep or not name or not split:
        raise ValueError(f"{what} {spec!r} must look like name:split (e.g. gsm8k:train)")
    return load_benchmark(name, split=split)


@dataclasses.dataclass(frozen=True)
class CorpusEntry:
    """One source of the codebook corpus: "name:split" (every example) or "name:split@N" (a stratified
    sample of N: `dlr_jax.data.protocol.stratified_sample`; the paper's "mathx_5m:train@603000")."""

    name: str
    split: str
    count: int = 0  # 0 = all

    @staticmethod
    def parse(spec: str) -> CorpusEntry:
        head, at, count = spec.strip().partition("@")
        name, sep, split = head.partition(":")
        ok = bool(sep and name and split) and (not at or count.replace("_", "").isdigit())
        if not ok or (at and int(count) <= 0):
            raise ConfigError(f"codebook corpus entry {spec!r} must look like name:split or name:split@N with "
                              "N > 0 examples (e.g. gsm8k_aug:train, mathx_5m:train@603000)")
        return CorpusEntry(name, split, int(count) if at else 0)

    def __str__(self) -> str:
        return f"{self.name}:{self.split}" + (f"@{self.count}" if self.count else "")


def load_corpus_entry(entry: CorpusEntry, seed: int = 0) -> tuple[list[Example], dict[str, Any]]:
    """An entry's examples and what was read (for the run's record): the count available where the whole
    source was read, the count taken, the seed of a sample and a digest of the ids."""
    from dlr_jax.data import protocol
    from dlr_jax.data.readers import BENCHMARKS

    spec = BENCHMARKS.get(entry.name)
    info: dict[str, Any] = {"entry": str(entry)}
    try:
        if entry.count and spec is not None and spec.folder:  # drawn while reading (MathX-5M: millions of records)
            examples = load_benchmark(entry.name, split=entry.split, sample=entry.count, seed=seed)
        else:
            examples = load_named_split(f"{entry.name}:{entry.split}", "codebook corpus entry")
            info["available"] = len(examples)
            if entry.count:
                examples = protocol.stratified_sample(examples, entry.count, seed)
    except protocol.SampleTooLarge as e:
        raise ConfigError(f"codebook corpus entry {entry}: {e}") from None
    if entry.count:
        info["sample_seed"] = seed
    info |= {"taken": len(examples), "ids_sha256": protocol.ids_digest(examples)}
    return examples, info


def corpus(cfg: Config, held_out: bool = False) -> tuple[list[str], dict[str, Any]]:
    """Training (or held-out) CoTs as the codebook renders them (`codebook.render_view`) and what was read:
    `codebook.corpus` / `eval_corpus` entries ("name:split", "name:split@N": a stratified sample of N drawn with
    data.split_seed), or the data section's dataset. Empty CoTs are left out (nothing to read back), counted. Under
    `codebook.render_unit=step` the texts are the CoTs' steps (`cot_view.step_views`), each rendered on its own."""
    entries = cfg.codebook.eval_corpus if held_out else cfg.codebook.corpus
    seed = cfg.data.split_seed
    if entries:
        parts = [load_corpus_entry(CorpusEntry.parse(e), seed) for e in entries]
        examples = [ex for exs, _ in parts for ex in exs]
        sources = [info for _, info in parts]
    else:
        split = cfg.data.eval_split if held_out else cfg.data.train_split
        examples = load_examples(cfg, split)
        sources = [{"entry": f"{cfg.data.dataset}:{split}", "taken": len(examples)}]
    view, unit = cfg.codebook.render_view, cfg.codebook.render_unit
    kept = [ex for ex in examples if ex.cot.strip()]
    # one text a canvas: the CoT, or each of its steps (codebook.render_unit=step)
    texts = [t for ex in kept for t in render_texts(ex.cot, view, unit, example_id=ex.id)]
    info = {"sources": sources, "render_view": view, "texts": len(texts),
            "empty_cot_left_out": len(examples) - len(kept)}
    if unit != "chain":  # recorded only off the paper's default, so a chain corpus.json reads as before
        info |= {"render_unit": unit, "cots": len(kept)}
    return texts, info


def corpus_texts(cfg: Config, held_out: bool = False) -> list[str]:
    """`corpus`'s texts."""
    return corpus(cfg, held_out)[0]
