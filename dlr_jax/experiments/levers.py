"""The `levers` experiment's variants: the small-scale levers of issue 16, one change of `main` each."""

from __future__ import annotations

from dlr_jax.config import Config
from dlr_jax.experiments.rendering import larger_canvas_overrides
from dlr_jax.experiments.variants import Method, Variant, codebook_stages, override_number


def levers(cfg: Config) -> tuple[tuple[Variant, ...], tuple[Method, ...]]:
    """One variant per small-scale lever of issue 16, each changing one thing of `main` and retraining from
    the first stage it affects; a row per lever (its DLR-SFT), compared with main's DLR-SFT. Width and
    depth change the backbone, so their variants train their own text baselines (rows of their own, and the
    gap their DLR-SFT closes is measured between them); with `init_from` the backbone is fixed and they are
    left out. The dual branch and the canvas only exist with the codebook's latents, and a pretrained
    DeepSeek-OCR-2 codebook (`codebook.init_from`) fixes d_c, has no dual branch and its query table
    bounds N, so those levers are left out there; a fixed canvas that would need more visual tokens than
    `codebook.num_queries` is too."""
    cb, t, lat, m = codebook_stages(cfg), cfg.train, cfg.latent, cfg.model
    own_codebook = bool(cb) and not cfg.codebook.init_from
    align_key = ("train.align.num_epochs", t.align.num_epochs * 4) if t.align.num_epochs else \
        ("train.align.num_steps", t.align.num_steps * 4)
    variants = [Variant("align_x4", (f"{align_key[0]}={override_number(align_key[1])}",), runs=("align", "sft"),
                        reuse=("textsft", *cb))]
    rows = [Method(f"align x4 ({override_number(align_key[1])} {align_key[0].rsplit('_', 1)[-1]})", "align_x4", "sft")]
    if own_codebook:
        variants += [Variant("dual_off", ("latent.dual_branch=off",), runs=("sft",), reuse=("textsft", *cb, "align")),
                     Variant("dual_x4", (f"latent.dual_branch_weight={lat.dual_branch_weight * 4:g}",), runs=("sft",),
                             reuse=("textsft", *cb, "align"))]
        rows += [Method("dual branch off", "dual_off", "sft"),
                 Method(f"dual-branch weight x4 ({lat.dual_branch_weight * 4:g})", "dual_x4", "sft")]
    if own_codebook or not cb:
        variants.append(Variant("dc_x4", (f"latent.latent_dim={lat.latent_dim * 4}",), runs=(*cb, "align", "sft"),
                                reuse=("textsft",)))
        # codebook.flow_hidden = 0 sizes the causal flow by d_c: the flow widens with the codes, as in the paper's
        # encoder, whose VQ sits on the flow's output (a linear map to a wider d_c would add no information)
        flow = " and the flow" if cb and not cfg.codebook.flow_hidden else ""
        rows.append(Method(f"d_c x4 ({lat.latent_dim * 4}{flow})", "dc_x4", "sft"))
    c = cfg.codebook
    if own_codebook and (c.min_side != c.max_side or ((c.max_side + 64) // 64) ** 2 <= c.num_queries):
        canvas = larger_canvas_overrides(cfg)
        variants.append(Variant("canvas", canvas, runs=(*cb, "align", "sft"), reuse=("textsft",)))
        what = (f"canvas {c.max_side + 64} px" if len(canvas) == 2 else "fonts x1.5")
        rows.append(Method(f"{what} (more visual tokens N)", "canvas", "sft"))
    # RL on top at a tenth of the learning rate: on the tiny task the default rate's updates overfit the
    # prompt pool (its reward rises while held-out Pass@1 falls); this row asks whether a gentler RL keeps
    # or adds to DLR-SFT (BENCHMARKS.md, "Why RL lowers greedy accuracy")
    lr = t.rl.learning_rate / 10
    variants.append(Variant("rl_lr_div10", (f"train.rl.learning_rate={lr:g}",), runs=("rl",),
                            reuse=("textsft", *cb, "align", "sft")))
    rows.append(Method(f"DLR-Full, RL learning rate / 10 ({lr:g})", "rl_lr_div10", "rl"))
    if not cfg.init_from:
        wide = (f"model.hidden_size={m.hidden_size * 2}", f"model.intermediate_size={m.intermediate_size * 2}",
                f"model.num_heads={m.num_heads * 2}", f"model.num_kv_heads={m.num_kv_heads * 2}")  # head_dim kept
        for name, over, what in (
                ("wide", wide, f"width x2 (hidden {m.hidden_size * 2})"),
                ("deep", (f"model.num_layers={m.num_layers * 2}",), f"depth x2 ({m.num_layers * 2} layers)")):
            variants.append(Variant(name, over, runs=("textsft", "align", "sft"), reuse=cb))
            base = (f"Direct-SFT, {what}", f"CoT-SFT, {what}")
            rows += [Method(base[0], name, "textsft_direct"), Method(base[1], name, "textsft_cot"),
                     Method(f"DLR-SFT, {what}", name, "sft", baselines=base)]
    return tuple(variants), tuple(rows)
