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


def test_data_gsm8k_cot_chooses_the_chain_gsm8k_trains_on(data_dir):
    """data.gsm8k_cot: GSM8K's solutions as written (annotations inline, the form of the synthetic task's natural
    chains) or the annotations alone (GSM8K-Aug's form, the default); a setting for another dataset is refused."""
    import re

    import pytest

    from dlr_jax.config import Config, DataConfig

    eq = load_examples(Config(data=DataConfig(dataset="gsm8k")), "test")
    raw = load_examples(Config(data=DataConfig(dataset="gsm8k", gsm8k_cot="raw")), "test")
    assert [(e.id, e.answer) for e in raw] == [(e.id, e.answer) for e in eq]
    assert raw[1].cot.startswith("It takes 2/2=<<2/2=1>>1 bolt of white fiber") and eq[1].cot == "<<2/2=1>> <<2+1=3>>"
    assert all(" ".join(re.findall(r"<<.*?>>", r.cot, flags=re.S)) == e.cot for r, e in zip(raw, eq, strict=True))
    from dlr_jax.config import ConfigError

    with pytest.raises(ConfigError, match="applies to data.dataset=gsm8k, not 'gsm8k_aug'"):
        DataConfig(dataset="gsm8k_aug", gsm8k_cot="raw")
    with pytest.raises(ConfigError, match=r"data\.gsm8k_cot must be equations\|raw\|natural, got 'words'"):
        DataConfig(dataset="gsm8k", gsm8k_cot="words")
