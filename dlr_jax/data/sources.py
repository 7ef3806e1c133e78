"""The examples a config names: `load_examples(cfg, split)` (the data section's dataset) and
`corpus_texts(cfg)` (the codebook stage's CoT corpus). Shared by the stages, evaluation and the
render-cache CLI, so none of them reaches into another for its inputs."""

from __future__ import annotations

from dlr_jax.config import Config
from dlr_jax.data.cot_view import cot_view
from dlr_jax.data.readers import load_benchmark
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


def load_named_split(spec: str, what: str = "entry") -> list[Example]:
    """The examples of a "name:split" entry (e.g. gsm8k:train), from the data root; `what` names the setting
    in the error for a malformed entry."""
    name, sep, split = spec.partition(":")
    if not sep or not name or not split:
        raise ValueError(f"{what} {spec!r} must look like name:split (e.g. gsm8k:train)")
    return load_benchmark(name, split=split)


def corpus_texts(cfg: Config, held_out: bool = False) -> list[str]:
    """Training (or held-out) CoTs as the codebook renders them (`codebook.render_view`):
    `codebook.corpus` / `eval_corpus` entries "name:split", or the data section's dataset. Empty CoTs
    are left out (nothing to read back)."""
    entries = cfg.codebook.eval_corpus if held_out else cfg.codebook.corpus
    if entries:
        examples = [ex for e in entries for ex in load_named_split(e, "codebook corpus entry")]
    else:
        examples = load_examples(cfg, cfg.data.eval_split if held_out else cfg.data.train_split)
    view = cfg.codebook.render_view
    return [cot_view(ex.cot, view, example_id=ex.id) for ex in examples if ex.cot.strip()]
