"""What an experiment runs: its variants (one workdir per variant and training seed), the stage
commands each variant needs, and the evaluations its table reads.

Nothing here imports JAX or loads a checkpoint: planning reads the resolved config (and the encoder table
init_from's config.json, where this machine has it), so `--dry-run` works for any config (a real backbone's
included) on any machine.

Sharing. The `main` variant of a seed runs every stage. Another variant runs only the stages its
change affects and *links* (relative symlinks) the finished products of the others from the same
seed's `main` workdir: e.g. `no_process_reward` links textsft, codebook, latents, align and sft and
runs rl alone; the K sweep links the text-SFT models (they have no latent rows) and trains its own
codebook onwards. A linked stage is never rerun, and every stage command is skipped once its
`final/meta.json` exists (the stages resume mid-way by themselves).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from collections.abc import Sequence
from pathlib import Path

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
FULL = "DLR-Full"
# `main --matched-baselines`: the text baselines retrained on as many examples as DLR-SFT's model saw.
MATCHED_DIRECT = "Direct-SFT, matched budget"
MATCHED_COT = "CoT-SFT, matched budget"
DIRECT_FROM_COT = "Direct-SFT from CoT-SFT, matched budget"


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


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of the plan, with the files whose presence means it is done."""

    seed: int
    variant: str
    kind: str  # "train" | "evaluate"
    stage: str
    argv: tuple[str, ...]
    done_files: tuple[Path, ...]
    workdir: Path
    links: tuple[tuple[Path, Path], ...] = ()  # (link, target) made before the command runs
    log: Path | None = None
    # evaluate steps: the benchmarks their results.json must hold, so adding one to eval.benchmarks
    # re-evaluates a finished run instead of skipping it
    benchmarks: tuple[str, ...] = ()

    def is_done(self) -> bool:
        return all(f.is_file() and _holds(f, self.benchmarks) for f in self.done_files)

    def shell(self) -> str:
        return shlex.join(self.argv)


def _holds(results: Path, benchmarks: Sequence[str]) -> bool:
    if not benchmarks:
        return True
    try:
        done = json.loads(results.read_text()).get("benchmarks", {})
    except (OSError, ValueError):
        return False
    return all(b in done for b in benchmarks)


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
# The encoder table's encoders (codebook.encoder) and their row labels; each at the default font, then half of it.
ENCODER_LABELS = {"deepencoder": "DeepEncoder V2", "qwen3_vl": "Qwen3-VL ViT"}
HALF_FONT = ", half font"
# Where the dry run's commands want the Qwen3-VL tower's directory when nothing gave it (a run refuses then).
ENCODER_FROM_PLACEHOLDER = "<QWEN3_VL_DIR>"


def codebook_stages(cfg: Config) -> tuple[str, ...]:
    return ("codebook", "export") if cfg.latent.source == "codebook" else ()


def main_variant(cfg: Config) -> Variant:
    return Variant("main", runs=("textsft", *codebook_stages(cfg), "align", "sft", "rl"))


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else repr(float(x))  # never 2.5e+06 for a step count


def matched_budget(cfg: Config) -> tuple[dict[str, float], bool]:
    """The text baselines' training for a budget equal to DLR-SFT's model's: ({textsft key: value}, whether
    the config's Direct-SFT already has it). DLR-SFT's model trained CoT-SFT, align and SFT (with
    `init_from`, align and SFT: the text SFTs start from the checkpoint too); in steps, the baselines get
    as many training examples (steps x batch_size summed over those stages, divided by their own batch
    size); in epochs (the paper recipe), the sum of the stages' epochs. Align counts in full although it
    trains only the projectors: the baselines get the larger budget."""
    if cfg.data.pack:  # a packed row holds several examples, more of the short Direct-SFT ones than CoT ones
        raise ValueError("--matched-baselines counts training examples as rows, which data.pack=true breaks; "
                         "run it with --set data.pack=false")
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
    v = Variant("matched", tuple(f"{k}={_number(want[k])}" for k in keys), runs=("textsft",),
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
        over = [f"train.textsft_direct.num_epochs={_number(sum(c.num_epochs for c in chain))}"]
    over += [f"train.textsft_direct.{f}={_number(v) if not isinstance(v, str) else v}" for f in OPTIMIZER_FIELDS
             if (v := getattr(t.sft, f)) != getattr(t.textsft_direct, f)]
    v = Variant("direct_from_cot", tuple(over), runs=("textsft",), reuse=("textsft",), textsft_mode="direct_from_cot")
    return v, Method(DIRECT_FROM_COT, "direct_from_cot", "textsft_direct_from_cot")


def half_font_overrides(cfg: Config) -> tuple[str, ...]:
    """Glyphs at half the size: the same text fills a quarter of the area, so the canvas (and N =
    (side/64)^2) shrinks. With a fixed canvas (min_side == max_side, as configs/tiny.yaml) the side is
    halved too, else the text would just sit in a corner of the same N-token image."""
    c = cfg.codebook
    out = [f"codebook.font_mean={c.font_mean / 2:g}", f"codebook.font_std={c.font_std / 2:g}",
           f"codebook.font_min={max(1, round(c.font_min / 2))}", f"codebook.font_max={max(1, round(c.font_max / 2))}"]
    if c.min_side == c.max_side:
        side = max(64, c.max_side // 2)
        out += [f"codebook.min_side={side}", f"codebook.max_side={side}"]
    return tuple(out)


def larger_canvas_overrides(cfg: Config) -> tuple[str, ...]:
    """More visual tokens per CoT: a fixed canvas (min_side == max_side) grows by 64 px (128 -> 192: N = 4 -> 9,
    fonts unchanged, so glyphs that were shrunk to fit get their size back); a canvas sized to the text gets
    glyphs 1.5x larger (the text covers 2.25x the area, so N grows about as much)."""
    c = cfg.codebook
    if c.min_side == c.max_side:
        side = c.max_side + 64
        return f"codebook.min_side={side}", f"codebook.max_side={side}"
    return (f"codebook.font_mean={c.font_mean * 1.5:g}", f"codebook.font_std={c.font_std * 1.5:g}",
            f"codebook.font_min={round(c.font_min * 1.5)}", f"codebook.font_max={round(c.font_max * 1.5)}")


def _levers(cfg: Config) -> tuple[tuple[Variant, ...], tuple[Method, ...]]:
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
    variants = [Variant("align_x4", (f"{align_key[0]}={_number(align_key[1])}",), runs=("align", "sft"),
                        reuse=("textsft", *cb))]
    rows = [Method(f"align x4 ({_number(align_key[1])} {align_key[0].rsplit('_', 1)[-1]})", "align_x4", "sft")]
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


def _encoders(cfg: Config, encoder_from: str | None) -> Experiment:
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
        return _encoders(cfg, encoder_from)
    cb = codebook_stages(cfg)
    main = main_variant(cfg)
    full = Method(FULL, "main", "rl")
    if name == "levers":
        variants, rows = _levers(cfg)
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
