"""`make demo`'s table names each method's training budget: DLR starts from the CoT-SFT model, so a
DLR-SFT row above Direct-SFT must not read as the latents' doing when it is the longer training."""

from __future__ import annotations

from pathlib import Path

from dlr_jax.config import load_config
from dlr_jax.demo import DEMO_OVERRIDES, training_budgets

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


def test_the_demo_table_gives_each_method_its_training_steps():
    cfg = load_config(TINY, list(DEMO_OVERRIDES))
    budgets, t = training_budgets(cfg), cfg.train
    assert budgets["Direct-SFT"] == str(t.textsft_direct.num_steps)
    assert budgets["CoT-SFT"] == str(t.textsft.num_steps)
    assert budgets["DLR-SFT"] == f"{t.textsft.num_steps} CoT + {t.align.num_steps} align + {t.sft.num_steps} SFT"
    assert budgets["DLR-RL"] == budgets["DLR-SFT"] + f" + {t.rl.num_steps} GRPO"
    # a recipe counted in epochs says so
    paper = training_budgets(load_config(TINY, [*DEMO_OVERRIDES, "train.sft.num_epochs=3"]))
    assert paper["DLR-SFT"].endswith("+ 3 ep SFT")
    # with init_from the latent stages start from the checkpoint, not from CoT-SFT
    own = training_budgets(load_config(TINY, [*DEMO_OVERRIDES, "init_from=weights/x"]))
    assert own["DLR-SFT"] == f"{t.align.num_steps} align + {t.sft.num_steps} SFT"
