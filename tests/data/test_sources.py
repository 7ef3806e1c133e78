"""load_examples: a config's splits, including another benchmark's split as the held-out one."""

from pathlib import Path

from dlr_jax.config import load_config
from dlr_jax.data.latents import latents_path
from dlr_jax.data.sources import load_examples

ROOT = Path(__file__).resolve().parents[2]


def test_the_math_recipe_holds_out_math500_beside_its_training_set(data_dir):
    """MATH 12k has only a train split: the paper's MATH recipe reads its held-out examples (export, the rl
    reward curve, the latent probe) from MATH-500, named "math500:test"."""
    cfg = load_config(ROOT / "configs" / "paper" / "math.yaml")
    assert cfg.data.eval_split == "math500:test"
    held_out = load_examples(cfg, cfg.data.eval_split)
    train = load_examples(cfg, cfg.data.train_split)
    assert len(held_out) == 500 and len(train) == 12000
    assert not {ex.question for ex in held_out} & {ex.question for ex in train}  # disjoint problems
    assert latents_path("w", "math500:test") == Path("w/latents/math500-test.jsonl")
    assert latents_path("w", "test") == Path("w/latents/test.jsonl")
