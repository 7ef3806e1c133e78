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


def test_the_demo_shortens_the_codebook_main_phase_but_not_its_warm_up():
    """The demo's codebook trains 150 main steps instead of tiny.yaml's 800; the 300-step continuous warm-up is
    what makes its ids carry the CoT (a 150-step warm-up gave CER true = shuffled, BENCHMARKS.md) and must stay."""
    tiny, demo = load_config(TINY), load_config(TINY, list(DEMO_OVERRIDES))
    assert demo.latent.source == "codebook"
    assert demo.codebook.train.num_steps < tiny.codebook.train.num_steps
    assert demo.codebook.alpha_steps <= demo.codebook.train.num_steps  # alpha reaches 0 inside the main phase
    assert demo.codebook.warmup_steps == tiny.codebook.warmup_steps >= 300
    # the compared methods' own budgets are tiny.yaml's
    for stage in ("textsft", "textsft_direct", "align", "sft"):
        assert getattr(demo.train, stage).num_steps == getattr(tiny.train, stage).num_steps
