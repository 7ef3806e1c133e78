"""The controls for DLR-SFT's training budget (`main --matched-baselines`): the text baselines retrained on as
many examples as DLR-SFT's model saw, and Direct-SFT trained from the CoT-SFT model for as long as DLR-SFT's
stages after it (what DLR-SFT's start gives without latents)."""

from __future__ import annotations

import math

from dlr_jax.config import Config
from dlr_jax.experiments.variants import Method, Variant, override_number

# `main --matched-baselines`: the text baselines retrained on as many examples as DLR-SFT's model saw.
MATCHED_DIRECT = "Direct-SFT, matched budget"
MATCHED_COT = "CoT-SFT, matched budget"
DIRECT_FROM_COT = "Direct-SFT from CoT-SFT, matched budget"


def matched_budget(cfg: Config) -> tuple[dict[str, float], bool]:
    """The text baselines' training for a budget equal to DLR-SFT's model's: ({textsft key: value}, whether
    the config's Direct-SFT already has it). DLR-SFT's model trained CoT-SFT, align and SFT (with
    `init_from`, align and SFT: the text SFTs start from the checkpoint too); in steps, the baselines get
    as many training examples (steps x batch_size summed over those stages, divided by their own batch
    size); in epochs (the paper recipe), the sum of the stages' epochs. Align counts in full although it
    trains only the projectors: the baselines get the larger budget."""
    if cfg.data.pack and cfg.data.pack_batch != "exact":
        # a packed row holds several examples, more of the short Direct-SFT ones than CoT ones: only exact steps
        # (data.pack_batch=exact, batch_size examples a step) count examples as padded steps do
        raise ValueError("--matched-baselines counts training examples as padded steps, which data.pack=true breaks "
                         "unless data.pack_batch=exact; run it with --set data.pack_batch=exact or data.pack=false")
    t = cfg.train
    chain = [("train.align", t.align), ("train.sft", t.sft)]
    if not cfg.init_from:
        chain.insert(0, ("train.textsft", t.textsft))
    if all(c.num_epochs == 0 for _, c in chain):
        examples = sum(c.num_steps * c.batch_size for _, c in chain)
        want = {"train.textsft.num_steps": math.ceil(examples / t.textsft.batch_size), "train.textsft.num_epochs": 0,
                "train.textsft_direct.num_steps": math.ceil(examples / t.textsft_direct.batch_size),
                "train.textsft_direct.num_epochs": 0}
        have = t.textsft_direct.num_epochs == 0 and t.textsft_direct.num_steps == want["train.textsft_direct.num_steps"]
        return want, have
    if all(c.num_epochs > 0 for _, c in chain):
        epochs = sum(c.num_epochs for _, c in chain)
        return {"train.textsft.num_epochs": epochs, "train.textsft_direct.num_epochs": epochs}, \
            t.textsft_direct.num_epochs == epochs
    mixed = ", ".join(f"{k}.num_epochs={c.num_epochs:g}" if c.num_epochs else f"{k}.num_steps={c.num_steps}"
                      for k, c in chain)
    raise ValueError(f"--matched-baselines needs DLR-SFT's stages counted in one unit (all num_steps or all "
                     f"num_epochs), got {mixed}")


def matched_variant(cfg: Config) -> tuple[Variant, tuple[Method, ...]]:
    """The variant retraining the text baselines on DLR-SFT's budget and its two table rows; when the config's
    Direct-SFT already has that budget (e.g. `--set train.textsft_direct.num_steps=...`), its row reads main's."""
    want, direct_has_it = matched_budget(cfg)
    keys = [k for k in want if not (direct_has_it and k.startswith("train.textsft_direct."))]
    v = Variant("matched", tuple(f"{k}={override_number(want[k])}" for k in keys), runs=("textsft",),
                textsft_mode="cot" if direct_has_it else "both")
    direct = Method(MATCHED_DIRECT, "main" if direct_has_it else "matched", "textsft_direct")
    return v, (direct, Method(MATCHED_COT, "matched", "textsft_cot"))


# The optimizer settings of a TrainConfig (not its length, batch, logging or seed).
OPTIMIZER_FIELDS = ("learning_rate", "warmup_ratio", "min_lr_ratio", "weight_decay", "b1", "b2", "eps", "grad_clip",
                    "optimizer")


def direct_from_cot_variant(cfg: Config) -> tuple[Variant, Method] | None:
    """The control for DLR-SFT's start: Direct-SFT trained from the seed's CoT-SFT model (textsft --mode
    direct_from_cot) on as many examples as DLR-SFT's model saw after CoT-SFT (align + SFT, counted as in
    `matched_budget`), with the SFT stage's optimizer settings (the rate DLR-SFT fine-tunes that model at, not
    Direct-SFT's from-scratch rate). DLR-SFT minus this row is what the latent tokens add beyond starting from a
    CoT-SFT model and training that long. None with `init_from`: there DLR-SFT starts from the checkpoint."""
    matched_budget(cfg)  # the same refusals: data.pack, stages counted in mixed units
    if cfg.init_from:
        return None
    t = cfg.train
    chain = (t.align, t.sft)
    if all(c.num_epochs == 0 for c in chain):
        steps = math.ceil(sum(c.num_steps * c.batch_size for c in chain) / t.textsft_direct.batch_size)
        over = [f"train.textsft_direct.num_steps={steps}", "train.textsft_direct.num_epochs=0"]
    else:
        over = [f"train.textsft_direct.num_epochs={override_number(sum(c.num_epochs for c in chain))}"]
    over += [f"train.textsft_direct.{f}={override_number(v) if not isinstance(v, str) else v}" for f in OPTIMIZER_FIELDS
             if (v := getattr(t.sft, f)) != getattr(t.textsft_direct, f)]
    v = Variant("direct_from_cot", tuple(over), runs=("textsft",), reuse=("textsft",), textsft_mode="direct_from_cot")
    return v, Method(DIRECT_FROM_COT, "direct_from_cot", "textsft_direct_from_cot")
