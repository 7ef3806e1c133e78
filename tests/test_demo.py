"""`make demo`'s table names each method's training budget: DLR starts from the CoT-SFT model, so a
DLR-SFT row above Direct-SFT must not read as the latents' doing when it is the longer training."""

from __future__ import annotations

from pathlib import Path

from dlr_jax.config import load_config
from dlr_jax.demo import DEMO_OVERRIDES, training_budgets

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
SMALL = ROOT / "configs" / "small" / "synthetic.yaml"  # the demo's default config


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


def test_the_demo_runs_the_small_recipe_shortened_with_direct_sft_on_dlrs_budget():
    """The demo's config is the small-scale recipe (step-aligned visual latents), its schedules shortened; the
    Direct-SFT row is the budget-matched baseline: as many steps as DLR-SFT's CoT-SFT start + align + SFT."""
    from dlr_jax.demo import main

    recipe, demo = load_config(SMALL), load_config(SMALL, list(DEMO_OVERRIDES))
    assert demo.latent.source == "codebook" and demo.codebook.render_unit == "step"
    assert demo.latent.codebook_init == recipe.latent.codebook_init
    t = demo.train
    assert t.textsft_direct.num_steps == t.textsft.num_steps + t.align.num_steps + t.sft.num_steps
    for key in ("warmup_steps",):
        assert 0 < getattr(demo.codebook, key) < getattr(recipe.codebook, key)
    assert 0 < demo.codebook.alpha_steps <= demo.codebook.train.num_steps < recipe.codebook.train.num_steps
    assert demo.train.sft.num_steps < recipe.train.sft.num_steps and 0 < t.rl.num_steps < recipe.train.rl.num_steps
    import inspect

    assert '"configs/small/synthetic.yaml"' in inspect.getsource(main)  # the parser's --config default
