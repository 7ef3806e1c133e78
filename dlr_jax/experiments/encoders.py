"""The paper's encoder table (the `encoder` experiment): DeepEncoder V2 vs Qwen3-VL's vision tower, each at the
default and at half the font size, and where the Qwen3-VL rows take the pretrained tower from."""

from __future__ import annotations

import json
from pathlib import Path

from dlr_jax.config import Config
from dlr_jax.experiments.rendering import half_font_overrides
from dlr_jax.experiments.variants import Experiment, Method, Variant, codebook_stages, main_variant

# The encoder table's encoders (codebook.encoder) and their row labels; each at the default font, then half of it.
ENCODER_LABELS = {"deepencoder": "DeepEncoder V2", "qwen3_vl": "Qwen3-VL ViT"}
HALF_FONT = ", half font"
# Where the dry run's commands want the Qwen3-VL tower's directory when nothing gave it (a run refuses then).
ENCODER_FROM_PLACEHOLDER = "<QWEN3_VL_DIR>"


def backbone_type(cfg: Config) -> str:
    """The backbone's model_type: init_from's config.json where this machine has it (a run takes the architecture
    from there), else the config's model section (which mirrors the published config.json)."""
    if cfg.init_from:
        try:
            return str(json.loads((Path(cfg.init_from) / "config.json").read_text()).get("model_type", ""))
        except (OSError, ValueError):
            pass
    return cfg.model.model_type


def qwen3_vl_tower(cfg: Config, given: str | None) -> tuple[str, str, str]:
    """Where the encoder table's Qwen3-VL rows take the tower from: (directory or "" = trained from scratch,
    why, what is missing). `given` (--encoder-from; "" = from scratch on purpose) wins; then the config's own
    codebook.encoder_from; then a qwen3_vl backbone's checkpoint (init_from), whose tower is the one the
    backbone was trained with. A full-scale run (init_from, or a Qwen3-VL backbone) left with none would compare
    a from-scratch tower, not Qwen3-VL's: that is what is missing."""
    c = cfg.codebook
    if given is not None:
        return given, "--encoder-from" if given else "--encoder-from '': from scratch", ""
    if c.encoder == "qwen3_vl" and c.encoder_from:
        return c.encoder_from, "codebook.encoder_from", ""
    if cfg.init_from and backbone_type(cfg) == "qwen3_vl":
        return cfg.init_from, "the backbone's checkpoint, init_from", ""
    if cfg.init_from or cfg.model.model_type == "qwen3_vl":
        return ENCODER_FROM_PLACEHOLDER, "its directory not given yet", (
            "the Qwen3-VL rows take Qwen3-VL's pretrained vision tower: give --encoder-from DIR (an HF qwen3_vl "
            "checkpoint directory; with --set init_from=DIR a qwen3_vl backbone lends its own), or --encoder-from '' "
            f"to train the tower from scratch (sized by codebook.vit_*); a dry run's commands say "
            f"{ENCODER_FROM_PLACEHOLDER} where DIR goes")
    return "", "from scratch, sized by codebook.vit_*", ""


def encoder_overrides(cfg: Config, encoder: str, tower: str = "") -> tuple[str, ...]:
    """The --set values that turn the config's codebook encoder into `encoder` (with the Qwen3-VL tower from
    `tower`, "" = from scratch). In this order because each --set is checked as it lands: encoder_from is
    refused unless the encoder is qwen3_vl, so it is cleared before and given after the encoder changes."""
    c, want = cfg.codebook, tower if encoder == "qwen3_vl" else ""
    out = []
    if c.encoder_from and c.encoder_from != want:
        out.append("codebook.encoder_from=")
    if c.encoder != encoder:
        out.append(f"codebook.encoder={encoder}")
    if want and c.encoder_from != want:
        out.append(f"codebook.encoder_from={want}")
    return tuple(out)


def encoder_experiment(cfg: Config, encoder_from: str | None) -> Experiment:
    """The paper's encoder table: DeepEncoder V2 vs Qwen3-VL's vision tower, each at the default and at half the
    font size. Every row trains its own codebook and the stages after it (the latents are its codes); the text
    SFT models have no latent rows, so they are shared. The row whose settings are the config's is main's
    DLR-Full, and DeepEncoder V2 at half font is the `half_font` experiment's variant (the same workdir)."""
    c = cfg.codebook
    if cfg.latent.source != "codebook":
        raise ValueError("encoder trains a codebook per encoder: it needs latent.source=codebook")
    if c.init_from or c.pretrained:
        raise ValueError("encoder trains each encoder's codebook from scratch; codebook.init_from / pretrained "
                         "bring DeepSeek-OCR-2's encoder and decoder (drop them for this table)")
    tower, why, needs = qwen3_vl_tower(cfg, encoder_from)
    half = half_font_overrides(cfg)
    variants: list[Variant] = [main_variant(cfg)]
    methods: list[Method] = []
    for enc, label in ENCODER_LABELS.items():
        sets = encoder_overrides(cfg, enc, tower)
        for font in ((), half):
            # the config's own encoder: main's run, and at half font the half_font experiment's variant (one
            # workdir for both); the other encoder: variants of its own
            name = ("main" if not font else "half_font") if not sets else enc + ("_half_font" if font else "")
            if name != "main":
                variants.append(Variant(name, (*sets, *font), runs=(*codebook_stages(cfg), "align", "sft", "rl"),
                                        reuse=("textsft",)))
            methods.append(Method(label + (HALF_FONT if font else ""), name, "rl"))
    where = f"from {tower} ({why})" if tower and not needs else why
    return Experiment("encoder", f"DeepEncoder V2 vs Qwen3-VL's vision tower ({where}), each at the default and at "
                      "half the font size; each trains its own codebook onwards", tuple(variants), tuple(methods),
                      full=ENCODER_LABELS["deepencoder"], needs=needs)
