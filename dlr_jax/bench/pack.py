"""Packed against padded rows: examples/s of the DLR-SFT step of a config on real GSM8K-Aug lengths.

    python -m dlr_jax.bench --out BENCHMARKS.md --only pack [--pack-config configs/tiny.yaml]
        [--pack-steps N] [--pack-set key=value ...]

The step is the sft stage's own: the config's latent LM (random init: speed does not depend on the weights),
`stages.common.lm_loss`, sft's trainable parameters, the `Trainer`. The batches are the stage's
(`data.pipeline.make_stage_dataset`: DLR-SFT rows `[x ; <latent> z </latent> <answer> a </answer>]` of
GSM8K-Aug's training CoTs, the config's BPE tokenizer trained on them, random latent ids of the counts the
codebook gives short CoTs), at data.max_len 256 (the paper's) and the config's batch size, once one example a
row (padded) and once packed several to a row (`data.pack=true`). Both sides read their batches before the
clock starts, run their steps interleaved one at a time, and the report gives the medians: seconds a step, the
examples a step holds, examples/s and the share of real tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.bench import common

DEFAULT_SET = ["data.dataset=gsm8k_aug", "data.max_len=256", "latent.dual_branch=off", "latent.source=random"]
MODES = ("padded", "packed")


@dataclasses.dataclass(frozen=True)
class PackResult:
    config: str
    overrides: tuple[str, ...]
    model: str
    params: int
    batch: int  # rows a step
    max_len: int
    examples: int  # in the epoch the batches come from
    step_s: dict[str, list[float]]  # mode -> seconds per timed step
    sequences: dict[str, list[int]]  # mode -> examples in each timed step's batch
    real: dict[str, float]  # mode -> share of the timed batches' tokens that are not padding
    first_s: dict[str, float]  # the first (compiling) step
    loads: tuple[float, ...] = ()

    def med(self, mode: str) -> float:
        return statistics.median(self.step_s[mode])

    def examples_per_s(self, mode: str) -> float:
        return statistics.mean(self.sequences[mode]) / self.med(mode)


def config_for(args: argparse.Namespace) -> Any:
    from dlr_jax.config import load_config

    return load_config(args.pack_config, [*DEFAULT_SET, *args.pack_set])


def bench_pack(args: argparse.Namespace, log: Callable[[str], None] = print) -> PackResult:
    from flax import nnx

    from dlr_jax.data.latents import random_latents
    from dlr_jax.data.pipeline import make_stage_dataset
    from dlr_jax.data.sources import load_examples
    from dlr_jax.models.latent_lm import LatentLM, filter_for_stage
    from dlr_jax.stages import common as stages
    from dlr_jax.training.trainer import Trainer

    loads = (common.start_load(args),)
    cfg = config_for(args)
    tcfg = dataclasses.replace(cfg.train.sft, progress=False, async_checkpointing=False, num_steps=1,
                               warmup_ratio=0.0, min_lr_ratio=1.0)
    steps = args.pack_steps
    with tempfile.TemporaryDirectory() as tmp:
        examples = load_examples(cfg, cfg.data.train_split)
        tok = stages.get_tokenizer(cfg, tmp, examples)
        mesh = stages.make_mesh_for(cfg)
        latents = random_latents(examples, cfg.latent.num_latents, seed=cfg.run.seed)
        trainers, batches, n, params = {}, {}, 0, 0
        for mode in MODES:
            data = make_stage_dataset("sft", examples, tok, batch_size=tcfg.batch_size, max_len=cfg.data.max_len,
                                      seed=cfg.run.seed, latents=latents, pack=mode == "packed", shard_index=0,
                                      shard_count=1)
            it = iter(data)
            batches[mode] = [next(it) for _ in range(steps + 1)]  # read before the clock starts
            n = data.examples
            backbone = stages.new_backbone(cfg, tok, mesh)
            model = LatentLM.from_backbone(backbone, tok, latent_dim=cfg.latent.latent_dim,
                                           rngs=nnx.Rngs(params=cfg.run.seed + 1),
                                           mesh=mesh if mesh.size > 1 else None, rules=cfg.mesh.rules)
            params = stages.count_params(model)
            loss = functools.partial(stages.lm_loss, vocab_mask=model.vocab_mask())
            trainers[mode] = Trainer(model, loss, tcfg, Path(tmp) / mode, mesh=mesh, rules=cfg.mesh.rules,
                                     trainable=filter_for_stage("sft", model.latent_cfg), name=f"pack-{mode}")
        first = {m: common.timed(lambda m=m: trainers[m].train_step(batches[m][0]))[0] for m in MODES}
        log("pack: first steps " + ", ".join(f"{m} {first[m]:.2f} s" for m in MODES))
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
             f"MLP {mc.intermediate_size}; vocabulary {tok.total_vocab_size} ({cfg.latent.num_latents} latent rows)")
    config = Path(args.pack_config).resolve()
    config_name = str(config.relative_to(common.REPO)) if config.is_relative_to(common.REPO) else str(config)
    return PackResult(config_name, tuple(args.pack_set), model, params, tcfg.batch_size, cfg.data.max_len,
                      n, step_s, seqs, real, first, loads)


def render_pack(res: PackResult, command: str, info: dict[str, str], allow_load: bool = False) -> str:
    refusal = common.ratio_refusal(list(res.loads), allow_load)
    row = lambda name, f: f"| {name} | " + " | ".join(f(m) for m in MODES) + " |"  # noqa: E731
    lines = common.header("Packed vs padded rows: the DLR-SFT step on GSM8K-Aug lengths", command, info) + [
        f"The sft stage's step (latent LM of `{res.config}`{', ' + ', '.join(res.overrides) if res.overrides else ''}: "
        f"{res.model}; {res.params:,} params; random init) on its own batches of GSM8K-Aug's training examples "
        f"({res.examples:,} that fit): {res.batch} rows of {res.max_len} tokens a step, one example a row (padded) "
        f"or several (packed, `data.pack=true`). Medians of {len(res.step_s['padded'])} timed steps a side, "
        "interleaved.",
        "",
        "| | padded rows | packed rows |",
        "|---|---|---|",
        row("examples a step (mean)", lambda m: f"{statistics.mean(res.sequences[m]):.1f}"),
        row("real tokens (share of the rows)", lambda m: f"{100 * res.real[m]:.0f} %"),
        row("seconds a step (median)", lambda m: f"{res.med(m):.3f}"),
        row("examples/s", lambda m: f"**{res.examples_per_s(m):,.1f}**"),
        row("first step s (trace + compile + run)", lambda m: f"{res.first_s[m]:.2f}"),
        "",
    ]
    ratio = res.examples_per_s("packed") / res.examples_per_s("padded")
    lines.append(f"Packed over padded, examples/s: {refusal}" if refusal else
                 f"Packed over padded, examples/s: **{ratio:.2f}x** (the same step cost a row; a packed row holds "
                 f"{statistics.mean(res.sequences['packed']) / statistics.mean(res.sequences['padded']):.2f}x the "
                 "examples).")
    return "\n".join(lines) + "\n"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pack-config", type=Path, default=common.TINY_CONFIG,
                    help="pack benchmark: config whose sft step runs (random init)")
    ap.add_argument("--pack-set", action="append", default=[], metavar="KEY=VALUE",
                    help=f"pack benchmark: config override (repeatable; after {' '.join(DEFAULT_SET)})")
    ap.add_argument("--pack-steps", type=int, default=10, help="pack benchmark: timed steps a side (>= 1)")


def check_arguments(args: argparse.Namespace) -> str | None:
    if args.pack_steps < 1:
        return f"--pack-steps must be >= 1, got {args.pack_steps}"
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
    return render_pack(bench_pack(args, log), command, info, allow_load=getattr(args, "allow_load", False))
