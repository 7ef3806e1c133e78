"""Codebook-stage throughput: can CoT rendering feed the encoder? (issue 4)

    python -m dlr_jax.bench --out BENCHMARKS.md --only codebook [--codebook-config configs/tiny.yaml]
        [--codebook-corpus gsm8k_aug:valid] [--codebook-examples N] [--codebook-set key=value ...]
        [--codebook-phases render,encode,train_alpha,train,live]

On real GSM8K-Aug CoTs and the config's `codebook:` section (random-init network: speed does not
depend on the weights), one epoch of the stage's own batch plan (`render_pipeline.BatchPlan`: the
config's font distribution, canvas sides bucketed, batch = codebook.train.batch_size) is run through,
repeat by repeat interleaved in one process:

- render: `render_pipeline.render_train_batch` (what each grain worker calls: draw + targets) on
  this thread alone, so images/s = images/s per core;
- encoder + VQ: the jitted `codebook_model.jit_encode` (H and nearest ids back on the host) per
  batch, as export runs it;
- train step: `Trainer.train_step` with `stages.codebook.codebook_loss` (encoder + noisy VQ + OCR
  decoder forward/backward + AdamW), as the stage runs it, in both of its phases: while alpha > 0
  the decoder also reads the continuous H (twice the decoder rows), afterwards it does not;
- live: the same alpha = 0 step fed by the stage's grain pipeline (`make_render_dataset` with
  data.num_workers) instead of pre-rendered batches: rendering and training share the machine.

Compiles (one per canvas side and step variant) happen in an untimed warm-up pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dlr_jax.bench import common

DEFAULT_CONFIG = common.TINY_CONFIG
PHASES = ("render", "encode", "train_alpha", "train", "live")
CONSUMERS = ("encode", "train_alpha", "train")  # what rendering must keep up with
LABELS = {
    "render": "render, 1 thread (`render_train_batch`)",
    "encode": "encoder + nearest-code VQ (`jit_encode`)",
    "train_alpha": "train step, alpha > 0 (decoder on [H_st ; H])",
    "train": "train step, alpha = 0 (decoder on H_st)",
    "live": "train step, alpha = 0, fed live by the grain pipeline",
}
SHORT = {"encode": "the encoder + VQ alone", "train_alpha": "a train step with alpha > 0",
         "train": "a train step with alpha = 0"}


@dataclasses.dataclass(frozen=True)
class CodebookBenchResult:
    config: str
    corpus: str
    examples: int  # CoTs in the plan
    batch_size: int
    num_workers: int  # data.num_workers: grain worker processes of the live pipeline (0 = a reader thread)
    params: int
    describe: str  # the networks' sizes
    sides: dict[int, int]  # canvas side -> batches of that side in the epoch
    tokens_per_image: float  # mean N = (side / 64)^2 over the epoch's images
    repeats: int
    phases: tuple[str, ...]  # the measured subset of PHASES, in PHASES order
    seconds: dict[str, list[float]]  # phase -> seconds for the whole epoch, per repeat
    side_seconds: dict[str, dict[int, list[float]]]  # phase -> side -> seconds per batch (all repeats)
    first_s: dict[str, float]  # warm-up: the first batch of each side (compiles), summed; live: one batch
    last_loss: float

    @property
    def images(self) -> int:
        return self.batch_size * sum(self.sides.values())

    def rate(self, phase: str) -> float:
        """images/s over the epoch, from the median repeat."""
        return self.images / statistics.median(self.seconds[phase])

    def side_rate(self, phase: str, side: int) -> float:
        return self.batch_size / statistics.median(self.side_seconds[phase][side])

    def ratio(self, phase: str) -> float:
        """Render images/s per core over `phase`'s images/s (>= 1: one core keeps up)."""
        return self.rate("render") / self.rate(phase)

    def workers(self, phase: str) -> int:
        """Render processes needed to feed `phase` at its measured rate."""
        return max(1, math.ceil(self.rate(phase) / self.rate("render")))


def load_corpus(spec: str, limit: int = 0, view: str = "cot") -> list[str]:
    """Non-empty CoTs of a `load_benchmark` "name:split" entry, the first `limit` (0 = all), as the
    codebook renders them under `view` (`codebook.render_view`)."""
    from dlr_jax.data.cot_view import cot_view
    from dlr_jax.data.sources import load_named_split

    examples = [ex for ex in load_named_split(spec, "--codebook-corpus") if ex.cot.strip()]
    examples = examples[:limit] if limit else examples
    return [cot_view(ex.cot, view, example_id=ex.id) for ex in examples]


def _describe(cb: Any, cfg: Any) -> str:
    return (f"ViT {cb.vit_layers} x d{cb.vit_hidden} (window {cb.vit_window}), neck {cb.neck_channels}, compressor "
            f"{cb.compressor_mid} -> {cfg.latent.latent_dim}, causal flow {cb.flow_layers} x d{cfg.latent.latent_dim}, "
            f"K = {cfg.latent.num_latents} codes, char decoder {cb.dec_layers} x d{cb.dec_hidden}")


def bench_codebook(cfg: Any, texts: list[str], *, repeats: int = 3, phases: Sequence[str] = PHASES,
                   config_name: str = "", corpus: str = "", log: Callable[[str], None] = print
                   ) -> CodebookBenchResult:
    """Runs the warm-up, then `repeats` interleaved rounds of each of `phases` over one epoch."""
    if err := check_phases(phases):
        raise ValueError(err)
    phases = tuple(p for p in PHASES if p in phases)
    from dlr_jax.data import render_pipeline as rp
    from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model, jit_encode
    from dlr_jax.stages.codebook.stage import codebook_loss
    from dlr_jax.training.trainer import Trainer

    cb = cfg.codebook
    tcfg = dataclasses.replace(cb.train, progress=False, async_checkpointing=False)
    plan = rp.BatchPlan(texts, batch_size=tcfg.batch_size, seed=cfg.run.seed, config=rp.render_config(cb),
                        max_text_len=cb.max_text_len)
    epoch = range(len(plan))
    render = lambda i: rp.render_train_batch(i, None, plan=plan, rows=slice(None))  # noqa: E731
    batches = [render(i) for i in epoch]
    sides = [b["images"].shape[1] for b in batches]
    log(f"codebook: {len(texts)} CoTs, {len(plan)} batches of {tcfg.batch_size} per epoch, "
        f"sides {dict(Counter(sides))}")

    model = build_codebook_model(CodebookModelConfig.from_config(cfg), seed=cfg.run.seed)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    graphdef, state = nnx.split(model)
    state = jax.tree.map(jnp.copy, state)  # the trainer donates the model's buffers; the encoder keeps its own
    loss = functools.partial(codebook_loss, lambda_vq=cb.lambda_vq, beta=cb.beta, dropout=cb.char_dropout)
    alpha = np.full(tcfg.batch_size, 0.5, np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        # One device, like the stage on this machine; a test session's fake devices would split the batch.
        trainer = Trainer(model, loss, tcfg, tmp, mesh=None, name="bench-codebook")
        stream: Iterator[dict[str, np.ndarray]] = (
            iter(rp.make_render_dataset(plan, num_workers=cfg.data.num_workers)) if "live" in phases else iter(()))

        def encode(b: dict[str, np.ndarray]) -> Any:
            return jax.device_get(jit_encode(graphdef, state, jnp.asarray(b["images"])))

        def step(b: dict[str, np.ndarray]) -> float:
            return trainer.train_step(b)["loss"]

        def live(_: dict[str, np.ndarray]) -> float:
            return step(next(stream))

        per_batch: dict[str, Callable[[Any], Any]] = {
            "render": render,
            "encode": lambda i: encode(batches[i]),
            "train_alpha": lambda i: step(batches[i] | {"alpha": alpha}),
            "train": lambda i: step(batches[i]),
            "live": live,
        }
        seconds: dict[str, list[float]] = {p: [] for p in phases}
        side_s: dict[str, dict[int, list[float]]] = {p: {s: [] for s in set(sides)} for p in phases}
        first: dict[str, float] = {}
        last_loss = float("nan")

        def run(phase: str, indices: Sequence[int], record: bool) -> float:
            nonlocal last_loss
            total = 0.0
            for i in indices:
                dt, out = common.timed(lambda i=i: per_batch[phase](i))
                total += dt
                if phase.startswith(("train", "live")):
                    last_loss = out
                if record and phase != "live":  # the live stream's sides are not the epoch's order
                    side_s[phase][sides[i]].append(dt)
            return total

        # Warm-up: the first batch of each side compiles each phase (the live phase reuses the train
        # step's compilation; its one batch starts the pipeline, so each repeat then reads the stream's
        # next epoch-length run of batches: the same side mix, up to the epoch boundary it straddles).
        first_of_side = [sides.index(s) for s in sorted(set(sides))]
        for phase in phases:
            first[phase] = run(phase, first_of_side if phase != "live" else [0], record=False)
        log("codebook: warm-up (first batch per side) " + ", ".join(f"{p} {first[p]:.2f}s" for p in phases))
        for r in range(repeats):
            for phase in phases if r % 2 == 0 else phases[::-1]:  # drift hits every phase alike
                seconds[phase].append(run(phase, epoch, record=True))
            log(f"codebook: repeat {r + 1}/{repeats}: " + ", ".join(
                f"{p} {len(plan) * tcfg.batch_size / seconds[p][-1]:.1f} img/s" for p in phases))
        trainer.ckpt.close()
    n_img = sum((s // 64) ** 2 for s in sides) / len(sides)
    return CodebookBenchResult(
        config=config_name, corpus=corpus, examples=len(texts), batch_size=tcfg.batch_size,
        num_workers=cfg.data.num_workers, params=n_params, describe=_describe(cb, cfg),
        sides=dict(sorted(Counter(sides).items())), tokens_per_image=n_img, repeats=repeats, phases=phases,
        seconds=seconds,
        side_seconds={p: {s: v for s, v in d.items() if v} for p, d in side_s.items()}, first_s=first,
        last_loss=last_loss)


# ----------------------------------------------------------------------------------------------
# Report.


def render_section(res: CodebookBenchResult, command: str, info: dict[str, str]) -> str:
    sides = sorted(res.sides)
    fmt = lambda xs: ", ".join(f"{res.images / x:.0f}" for x in xs)
    lines = common.header("Codebook stage: render throughput vs encoder + VQ and train step", command, info) + [
        f"Config: `{res.config}` `codebook:` section ({res.describe}; {res.params / 1e6:.2f}M params, random "
        f"init, fp32). Data: {res.examples} {res.corpus} CoTs in the stage's batch plan (font size drawn per "
        f"CoT from the config's clipped Gaussian; canvases bucketed by side), one epoch = "
        f"{sum(res.sides.values())} batches of {res.batch_size} = {res.images} images, sides "
        + ", ".join(f"{s} px x {n} batches" for s, n in res.sides.items())
        + f" (mean {res.tokens_per_image:.1f} visual tokens per image). Images/s of the whole epoch, median of "
        f"{res.repeats} repeats after a warm-up that compiled every side and variant; all phases in one "
        "process, interleaved repeat by repeat (order reversed every other repeat). Render runs on this thread "
        "alone (images/s per core); the JAX phases use XLA's threads.",
        "",
        "| phase | images/s (median) | images/s per repeat | "
        + " | ".join(f"{s} px images/s" for s in sides) + " | render per core / this | render workers needed |",
        "|---|---|---|" + "---|" * len(sides) + "---|---|",
    ]
    for p in res.phases:
        per_side = " | ".join(f"{res.side_rate(p, s):.0f}" if s in res.side_seconds.get(p, {}) else "-"
                              for s in sides)
        ratio = "-" if p == "render" else f"**{res.ratio(p):.1f}x**"
        need = "-" if p in ("render", "live") else str(res.workers(p))
        lines.append(f"| {LABELS[p]} | **{res.rate(p):,.1f}** | {fmt(res.seconds[p])} | {per_side} | {ratio} "
                     f"| {need} |")
    lines += [
        "",
        "Warm-up, first batch of each side (compile + run), s: "
        + ", ".join(f"{p} {res.first_s[p]:.1f}" for p in res.phases if p != "live")
        + f". Loss after the last step {res.last_loss:.3f}.",
        "",
        f"Interpretation: {interpret(res)}",
    ]
    return "\n".join(lines) + "\n"


def interpret(res: CodebookBenchResult) -> str:
    """One paragraph from the numbers: does one render core keep up, and what the pipeline gives."""
    r = res.rate("render")
    consumers = [p for p in CONSUMERS if p in res.phases]
    fastest = max(consumers, key=res.rate)
    keeps = all(res.ratio(p) >= 1 for p in consumers)
    need = res.workers(fastest)
    text = (f"rendering {'keeps up' if keeps else 'does not keep up'} on this machine: one core renders {r:,.0f} "
            "images/s, " + ", ".join(f"{res.ratio(p):.1f}x what {SHORT[p]} consume{'s' * (p != 'encode')} "
                                     f"({res.rate(p):,.1f}/s)" for p in consumers)
            + f"; {need} render process{'es are' if need > 1 else ' is'} enough to feed the fastest, "
            f"{SHORT[fastest]}. ")
    pipe = (f"{res.num_workers} grain worker process{'es' * (res.num_workers != 1)}" if res.num_workers
            else "no worker processes: one grain reader thread in the training process renders ahead")
    text += f"The stage's pipeline uses data.num_workers = {res.num_workers} ({pipe})"
    if "train" in res.phases:
        text += f"; rendering for the alpha = 0 step takes {100 * res.rate('train') / r:.1f}% of one core"
    if "live" in res.phases:
        live = res.rate("live") / res.rate("train")
        text += (f", and fed live the step ran at {100 * live:.0f}% of its rate on pre-rendered batches"
                 + (" (XLA's step already fills these cores: rendering alongside it costs the step its CPU time)"
                    if live < 0.95 else " (rendering overlaps the step)"))
    text += "."
    if not keeps:
        text += (f" Set data.num_workers >= {max(res.workers(p) for p in consumers)} (or pre-render to ArrayRecord "
                 "shards) so that the encoder does not wait.")
    return text


# ----------------------------------------------------------------------------------------------
# CLI hooks (`python -m dlr_jax.bench --only codebook`).


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--codebook-config", type=Path, default=DEFAULT_CONFIG,
                    help="codebook benchmark: config whose codebook/latent/data sections are used")
    ap.add_argument("--codebook-set", action="append", default=[], metavar="KEY=VALUE",
                    help="codebook benchmark: config override (repeatable), e.g. codebook.train.batch_size=8")
    ap.add_argument("--codebook-corpus", default="gsm8k_aug:valid",
                    help="codebook benchmark: CoTs as a load_benchmark name:split")
    ap.add_argument("--codebook-examples", type=int, default=0,
                    help="codebook benchmark: use the first N CoTs (0 = all)")
    ap.add_argument("--codebook-phases", default=",".join(PHASES),
                    help="codebook benchmark: comma-separated subset of " + ",".join(PHASES)
                    + " (render and one of " + ",".join(CONSUMERS) + " needed; live needs train)")


def check_phases(phases: Sequence[str]) -> str | None:
    bad = [p for p in phases if p not in PHASES]
    if bad:
        return f"--codebook-phases: unknown phase(s) {bad}; choose from {','.join(PHASES)}"
    if "render" not in phases or not any(p in phases for p in CONSUMERS):
        return f"--codebook-phases needs render and at least one of {','.join(CONSUMERS)}, got {','.join(phases)}"
    if "live" in phases and "train" not in phases:
        return "--codebook-phases: live needs train (it compares against it and reuses its compilation)"
    return None


def _phases(args: argparse.Namespace) -> list[str]:
    return [p.strip() for p in args.codebook_phases.split(",") if p.strip()]


def check_arguments(args: argparse.Namespace) -> str | None:
    if args.codebook_examples < 0:
        return f"--codebook-examples must be >= 0, got {args.codebook_examples}"
    if ":" not in args.codebook_corpus:
        return f"--codebook-corpus must look like name:split, got {args.codebook_corpus!r}"
    from dlr_jax.data.readers import NAMES

    name = args.codebook_corpus.partition(":")[0]
    if name not in NAMES:
        return f"--codebook-corpus {args.codebook_corpus!r}: unknown benchmark {name!r}; known: {', '.join(NAMES)}"
    return check_phases(_phases(args))


def missing_inputs(args: argparse.Namespace) -> str | None:
    """What this machine lacks to run the section (the corpus's benchmark file), or None: `make bench` skips
    the section, saying why, instead of failing after the sections before it ran."""
    from dlr_jax.data.readers import SYNTHETIC_FAMILY, benchmark_file

    name, _, split = args.codebook_corpus.partition(":")
    if name in SYNTHETIC_FAMILY:  # generated in code: nothing to read
        return None
    try:
        path = benchmark_file(name, split)
    except FileNotFoundError as e:  # no data root at all
        return f"--codebook-corpus {args.codebook_corpus} needs the benchmark data: {e}"
    except ValueError as e:  # an unknown split
        return f"--codebook-corpus {args.codebook_corpus}: {e}"
    return None if path.is_file() else f"--codebook-corpus {args.codebook_corpus}: {path} not found"


def run_section(args: argparse.Namespace, command: str, info: dict[str, str],
                log: Callable[[str], None] = print) -> str:
    """Runs the `codebook` benchmark and returns its BENCHMARKS.md section."""
    from dlr_jax.config import load_config

    err = check_arguments(args)
    if err:
        raise ValueError(err)
    cfg = load_config(args.codebook_config, args.codebook_set)
    texts = load_corpus(args.codebook_corpus, args.codebook_examples, cfg.codebook.render_view)
    try:
        name = str(Path(args.codebook_config).resolve().relative_to(common.REPO))
    except ValueError:
        name = str(args.codebook_config)
    name += "".join(f" --codebook-set {o}" for o in args.codebook_set)
    res = bench_codebook(cfg, texts, repeats=args.repeats, phases=_phases(args), config_name=name,
                         corpus=_corpus_label(args.codebook_corpus, cfg.codebook.render_view), log=log)
    return render_section(res, command, info)


def _corpus_label(spec: str, view: str) -> str:
    return spec if view == "cot" else f"{spec} (render_view {view})"
