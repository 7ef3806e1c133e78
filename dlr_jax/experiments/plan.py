"""Which experiment runs what: the experiments by name (EXPERIMENTS), each as its variants and the table rows
it evaluates (`experiment`); the variants' types are in variants.py, the commands they become in runner.py.

Nothing here imports JAX or loads a checkpoint: planning reads the resolved config (and the encoder table
init_from's config.json, where this machine has it), so `--dry-run` works for any config (a real backbone's
included) on any machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dlr_jax.config import Config
from dlr_jax.experiments.baselines import direct_from_cot_variant, matched_variant
from dlr_jax.experiments.encoders import encoder_experiment
from dlr_jax.experiments.levers import levers
from dlr_jax.experiments.rendering import half_font_overrides
from dlr_jax.experiments.variants import FULL, Experiment, Method, Variant, codebook_stages, main_variant

EXPERIMENTS = ("main", "no_align", "no_rl", "no_process_reward", "forced_stop", "k_sweep", "half_font", "ablations",
               "levers", "stages", "decoding", "encoder")
# The paper's tables, each printed in its layout (benchmarks' Acc. and #L, then their average; report.py):
# `stages` its stage ablation (-Align, -SFT, -RL, -Proc, Full), `k_sweep` its codebook sizes, `decoding` its
# dynamic vs forced-stop decoding, `encoder` its encoders at two font sizes.
PAPER_TABLES = ("stages", "k_sweep", "decoding", "encoder")
# Forced stops: the paper's decoding table stops after n in {4, 6, 8, 10} latents; forced_stop keeps its own
# smaller defaults (tiny configs' CoTs have 4 codes).
PAPER_FORCE_STOPS = (4, 6, 8, 10)
DEFAULT_FORCE_STOPS = (2, 4, 6, 8)
# The paper's codebook sizes {2.5K, 5K, 10K, 20K, 40K} around its K = 10K, as multiples of the config's K.
K_GRID = (0.25, 0.5, 1, 2, 4)
STAGE_ROWS = ("−Align", "−SFT", "−RL", "−Proc")  # the stage table's ablation rows; its last row is DLR-Full


def k_values(cfg: Config, given: Sequence[int] | None) -> tuple[int, ...]:
    """The K sweep: the paper's grid scaled to the config's K (K/4, K/2, K, 2K, 4K: 2.5K ... 40K at K = 10K)
    unless given; always including the config's K (that point is the main run's DLR-Full)."""
    k = cfg.latent.num_latents
    vals = set(given) if given else {max(2, round(k * f)) for f in K_GRID}
    vals.add(k)
    return tuple(sorted(vals))


def experiment(name: str, cfg: Config, *, ks: Sequence[int] | None = None,
               force_stops: Sequence[int] | None = None, matched: bool = False,
               encoder_from: str | None = None) -> Experiment:
    """The variants and table rows of experiment `name` (see EXPERIMENTS) for the resolved config;
    `matched` (main only) adds the text baselines retrained on DLR-SFT's budget (`matched_variant`).
    force_stops: None = the paper's (4, 6, 8, 10) for `decoding`, (2, 4, 6, 8) for the others.
    encoder_from (encoder only): the Qwen3-VL rows' tower, "" = from scratch (None: `qwen3_vl_tower` finds it)."""
    if not force_stops:
        force_stops = PAPER_FORCE_STOPS if name == "decoding" else DEFAULT_FORCE_STOPS
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}")
    if matched and name != "main":
        raise ValueError(f"--matched-baselines adds rows to the main experiment, not to {name!r}")
    if encoder_from is not None and name != "encoder":
        raise ValueError(f"--encoder-from gives the encoder experiment's Qwen3-VL tower; {name!r} has none")
    if name == "encoder":
        return encoder_experiment(cfg, encoder_from)
    cb = codebook_stages(cfg)
    main = main_variant(cfg)
    full = Method(FULL, "main", "rl")
    if name == "levers":
        variants, rows = levers(cfg)
        return Experiment("levers", "the small-scale levers, one change of `main` each, against its DLR-SFT",
                          (main, *variants),
                          (Method("Direct-SFT", "main", "textsft_direct"), Method("CoT-SFT", "main", "textsft_cot"),
                           Method("DLR-SFT", "main", "sft"), Method(f"{FULL} (RL on top)", "main", "rl"), *rows),
                          full="DLR-SFT")
    if name == "main":
        variants, rows = (main,), (Method("Direct-SFT", "main", "textsft_direct"),
                                   Method("CoT-SFT", "main", "textsft_cot"))
        desc = ("Direct-SFT, CoT-SFT, DLR-SFT and DLR-Full (= DLR-SFT + latent GRPO) on one backbone"
                + (", and the text baselines on DLR-SFT's training budget" if matched else ""))
        if matched:
            v, extra = matched_variant(cfg)
            variants, rows = (main, v), (*rows, *extra)
            control = direct_from_cot_variant(cfg)
            if control is not None:
                variants, rows = (*variants, control[0]), (*rows, control[1])
                desc += ", and Direct-SFT from CoT-SFT (the control for DLR-SFT's start)"
        return Experiment("main", desc,
                          variants, (*rows, Method("DLR-SFT", "main", "sft"), full))
    parts: dict[str, tuple[tuple[Variant, ...], tuple[Method, ...]]] = {}
    # w/o align: align trains 1 step at learning rate 0, which saves the freshly built latent LM (random
    # projectors, the codebook's rows) as align's output — exactly what sft would start from without the
    # stage — so the stage code needs no switch for the ablation. num_epochs=0: the paper recipe counts
    # align in epochs, which would replace the one step by three epochs of no-ops.
    parts["no_align"] = ((Variant("no_align", ("train.align.learning_rate=0.0", "train.align.num_steps=1",
                                               "train.align.num_epochs=0", "train.align.warmup_ratio=0.0"),
                                  runs=("align", "sft", "rl"), reuse=("textsft", *cb)),),
                         (Method("w/o align", "no_align", "rl"),))
    # w/o SFT (RL straight after align): sft trains 1 step at learning rate 0 (the no_align trick), so its output
    # is align's latent LM (and, with the dual branch, the codebook stage's OCR decoder unchanged), which rl starts
    # from and keeps as its KL reference
    parts["no_sft"] = ((Variant("no_sft", ("train.sft.learning_rate=0.0", "train.sft.num_steps=1",
                                           "train.sft.num_epochs=0", "train.sft.warmup_ratio=0.0"),
                                runs=("sft", "rl"), reuse=("textsft", *cb, "align")),),
                       (Method("w/o SFT (RL after align)", "no_sft", "rl"),))
    parts["no_rl"] = ((), (Method("w/o RL (= DLR-SFT)", "main", "sft"),))
    parts["no_process_reward"] = ((Variant("no_process_reward", ("rl.process_weight=0.0",), runs=("rl",),
                                           reuse=("textsft", *cb, "align", "sft")),),
                                  (Method("w/o process reward", "no_process_reward", "rl"),))
    parts["forced_stop"] = ((), tuple(Method(f"forced stop n={n}", "main", "rl", force_latents=n, group="forced_stop",
                                             x=float(n)) for n in force_stops))
    kv = k_values(cfg, ks)
    k0 = cfg.latent.num_latents
    parts["k_sweep"] = (tuple(Variant(f"k{k}", (f"latent.num_latents={k}",), runs=(*cb, "align", "sft", "rl"),
                                      reuse=("textsft",), link_tokenizer=False) for k in kv if k != k0),
                        tuple(Method(f"K={k}" + (" (= DLR-Full)" if k == k0 else ""), "main" if k == k0 else f"k{k}",
                                     "rl", group="k_sweep", x=float(k)) for k in kv))
    if cfg.latent.source == "codebook":
        parts["half_font"] = ((Variant("half_font", half_font_overrides(cfg), runs=(*cb, "align", "sft", "rl"),
                                       reuse=("textsft",)),),
                              (Method("half font", "half_font", "rl"),))
    elif name in ("half_font", "ablations"):
        if name == "half_font":
            raise ValueError("half_font changes the rendering of the codebook stage: it needs latent.source=codebook")
    if name == "stages":  # the paper's stage table: its rows, in its order, then Full
        rows = ((parts["no_align"], STAGE_ROWS[0]), (parts["no_sft"], STAGE_ROWS[1]), (parts["no_rl"], STAGE_ROWS[2]),
                (parts["no_process_reward"], STAGE_ROWS[3]))
        variants_s = [main, *(v for (vs, _), _ in rows for v in vs)]
        methods_s = [dataclasses.replace(ms[0], label=label) for (_, ms), label in rows]
        return Experiment("stages", "the paper's stage ablation: DLR-Full without align, without SFT (RL right after "
                          "align), without RL, without the process reward", tuple(variants_s),
                          (*methods_s, full))
    if name == "decoding":  # dynamic decoding (the model closes </latent> itself) vs the paper's forced stops
        return Experiment("decoding", f"DLR-Full decoding dynamically vs </latent> forced after n in "
                          f"{list(force_stops)} latents", (main,), (full, *parts["forced_stop"][1]))
    chosen = [n for n in parts if name in (n, "ablations")]
    variants: list[Variant] = [main]
    methods: list[Method] = [full]
    for n in chosen:
        vs, ms = parts[n]
        variants += [v for v in vs if v not in variants]
        methods += [m for m in ms if m.label != full.label and not (m.variant == "main" and m.stage == "rl"
                                                                      and m.force_latents is None)]
    if name in ("k_sweep", "ablations"):  # the config's K is the full method: keep it in the sweep's plot
        methods = [dataclasses.replace(full, group="k_sweep", x=float(k0)), *methods[1:]]
    desc = {"no_align": "DLR-Full without the align stage", "no_rl": "DLR-Full vs DLR-SFT",
            "no_process_reward": "DLR-Full vs latent GRPO without the process reward",
            "forced_stop": "DLR-Full with </latent> forced after n latents",
            "k_sweep": f"codebook size K in {list(kv)}", "half_font": "CoTs rendered at half the font size",
            "ablations": "every ablation of the paper's table"}[name]
    if name == "ablations" and "half_font" not in parts:
        desc += (f" except half font (latent.source={cfg.latent.source}: no codebook renders the CoTs; "
                 "--set latent.source=codebook adds it)")
    return Experiment(name, desc, tuple(variants), tuple(methods))
