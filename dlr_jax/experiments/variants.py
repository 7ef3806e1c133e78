"""What an experiment is: the variants it trains (one workdir per variant and training seed) and the table
rows (methods) it evaluates from them.

Sharing. The `main` variant of a seed runs every stage. Another variant runs only the stages its
change affects and *links* (relative symlinks) the finished products of the others from the same
seed's `main` workdir: e.g. `no_process_reward` links textsft, codebook, latents, align and sft and
runs rl alone; the K sweep links the text-SFT models (they have no latent rows) and trains its own
codebook onwards. A linked stage is never rerun, and every stage command is skipped once its
`final/meta.json` exists (the stages resume mid-way by themselves).
"""

from __future__ import annotations

import dataclasses

from dlr_jax.config import Config

# Training commands in pipeline order; textsft trains CoT-SFT and Direct-SFT (--mode both).
STAGE_ORDER = ("textsft", "codebook", "export", "align", "sft", "rl")
# The directories a finished training command leaves (each with final/meta.json).
DONE_DIRS = {"textsft": ("textsft_cot", "textsft_direct"), "codebook": ("codebook",), "export": ("export",),
             "align": ("align",), "sft": ("sft",), "rl": ("rl",)}
# What a variant links when it reuses a stage: its done dirs plus the files later stages read.
PRODUCTS = {**DONE_DIRS, "export": ("export", "latents")}
# The text-SFT directories `--stage textsft --mode M` finishes.
TEXTSFT_DIRS = {"both": ("textsft_cot", "textsft_direct"), "cot": ("textsft_cot",), "direct": ("textsft_direct",),
                "direct_from_cot": ("textsft_direct_from_cot",)}
# The full method: DLR-SFT + latent GRPO.
FULL = "DLR-Full"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One training configuration; its workdir is <W>/seed<s>/<name>."""

    name: str
    overrides: tuple[str, ...] = ()  # --set values on top of the experiment's (they win)
    runs: tuple[str, ...] = STAGE_ORDER  # training commands run in its own workdir, in order
    reuse: tuple[str, ...] = ()  # stages linked from the seed's main workdir
    # The tokenizer holds K latent ids, so variants that change K build their own.
    link_tokenizer: bool = True
    textsft_mode: str = "both"  # what its textsft command trains (TEXTSFT_DIRS)

    def done_dirs(self, stage: str) -> tuple[str, ...]:
        return TEXTSFT_DIRS[self.textsft_mode] if stage == "textsft" else DONE_DIRS[stage]


@dataclasses.dataclass(frozen=True)
class Method:
    """One row of the table: a stage of a variant, evaluated (optionally with a forced stop)."""

    label: str
    variant: str
    stage: str
    force_latents: int | None = None
    group: str = ""  # "k_sweep" / "forced_stop": the rows a plot draws
    x: float | None = None  # the swept value (K, n)
    # the (Direct-SFT, CoT-SFT) rows whose gap this row's "share closed" is measured against: the levers
    # that change the backbone (width, depth) bring their own baselines
    baselines: tuple[str, str] = ("Direct-SFT", "CoT-SFT")

    @property
    def is_text_baseline(self) -> bool:  # Direct-SFT / CoT-SFT rows: no latents, no gap or cost of their own
        return self.stage.startswith("textsft")

    @property
    def tag(self) -> str:
        return "" if self.force_latents is None else f"n{self.force_latents}"


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    variants: tuple[Variant, ...]
    methods: tuple[Method, ...]
    full: str = FULL  # p-values compare every row with this one
    # what a run lacks before it may start (the dry run prints it, a run refuses): "" when nothing
    needs: str = ""


def codebook_stages(cfg: Config) -> tuple[str, ...]:
    return ("codebook", "export") if cfg.latent.source == "codebook" else ()


def main_variant(cfg: Config) -> Variant:
    return Variant("main", runs=("textsft", *codebook_stages(cfg), "align", "sft", "rl"))


def override_number(x: float) -> str:
    """A number as a --set value."""
    return str(x) if isinstance(x, int) else repr(float(x))  # never 2.5e+06 for a step count

