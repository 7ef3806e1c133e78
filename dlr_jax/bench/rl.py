"""Latent GRPO throughput: rollout tokens/s and where one RL step's time goes (issue 5).

    python -m dlr_jax.bench --out BENCHMARKS.md --only rl [--rl-config configs/tiny.yaml]
        [--rl-steps N] [--rl-set key=value ...] [--rl-workdir W] [--rl-process-reward]

The step is the stage's own: `dlr_jax.stages.rl.stage.run` on a scratch workdir for 1 + N RL steps, and
the numbers are its per-step `time/*` metrics (rollout = prompts drawn + `Sampler.generate` +
assembling rows; score = teacher-forced old and reference log-probs; rewards = parsing + rewards +
advantages; update = mu inner epochs of `Trainer` steps + resharding the policy for the sampler).
The first step compiles everything and is reported apart; the medians are over the N steps after it.

Without `--rl-workdir` the scratch workdir holds what the stage reads, written in the stages' own
formats from untrained models of the config (a BPE tokenizer trained on the config's data, a random
backbone as textsft_cot/final, the random latent LM as sft/final): speed does not depend on the
weights, but rollout lengths do — an untrained policy rarely emits `</answer>`, so its rollouts run
to rl.max_new_tokens (the slowest case; the report gives the mean length). `--rl-workdir W` links a
trained workdir's tokenizer and stage outputs instead (its config.yaml is used; W is not written).
The process reward r_proc runs only with an OCR decoder: the workdir's codebook stage, or with
`--rl-process-reward` a random-init one of the config's `codebook:` section (an untrained policy
seldom closes a `<latent>` span, so r_proc then has little to decode: time it on a trained workdir).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dlr_jax.bench import common
from dlr_jax.data.sources import load_examples
from dlr_jax.run.handoff import save_stage_model

DEFAULT_CONFIG = common.TINY_CONFIG
PHASES = ("rollout", "score", "rewards", "update")
LINKED = ("tokenizer", "textsft_cot", "sft", "codebook")  # what the rl stage reads from a workdir
# The benchmark's own bookkeeping: no reward-curve evaluation, no progress bar, synchronous checkpoints and
# only the final one.
FIXED = ["rl.eval_prompts=0", "train.rl.progress=false", "train.rl.async_checkpointing=false",
         "train.rl.checkpoint_every=1000000"]


@dataclasses.dataclass(frozen=True)
class RLBenchResult:
    config: str
    source: str  # "random init" or the trained workdir
    model: str  # the policy's sizes
    params: int
    prompts: int  # P
    group: int  # G
    max_new_tokens: int
    max_latents: int
    inner_epochs: int  # mu
    batch_size: int  # rollouts per optimizer update
    beta: float
    process: bool  # r_proc ran
    history: list[dict[str, float]]  # rl.run's per-step metrics, the warm-up step first

    @property
    def rollouts(self) -> int:
        return self.prompts * self.group

    @property
    def timed(self) -> list[dict[str, float]]:
        return self.history[1:]

    def med(self, key: str) -> float:
        return statistics.median(h[key] for h in self.timed)

    def phase_s(self, phase: str) -> float:
        return self.med(f"time/{phase}")

    def share(self, phase: str) -> float:
        """Median seconds of `phase` over the sum of the phases' medians (so the shares add up to 1)."""
        return self.phase_s(phase) / sum(self.phase_s(p) for p in PHASES)

    def rollout_tokens(self, h: dict[str, float]) -> float:
        """Generated tokens in one step's rollouts (latents, boundary tokens and the stop token included)."""
        return self.rollouts * h["completion_length"]

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(self.rollout_tokens(h) / h["time/rollout"] for h in self.timed)

    @property
    def updates_per_step(self) -> int:
        return self.inner_epochs * self.rollouts // self.batch_size


# ----------------------------------------------------------------------------------------------
# The scratch workdir.


def random_workdir(cfg: Any, workdir: Path) -> None:
    """Writes what stage rl reads (tokenizer, textsft_cot/final, sft/final) from untrained models."""
    from dlr_jax.stages import common as stage_common
    from dlr_jax.stages.latent_common import new_latent_lm

    stage_common.prepare_workdir(cfg, workdir)
    tok = stage_common.get_tokenizer(cfg, workdir, load_examples(cfg, cfg.data.train_split))
    mesh = stage_common.make_mesh_for(cfg)
    backbone = stage_common.new_backbone(cfg, tok, mesh)
    save_stage_model(backbone, workdir, "textsft_cot", kind="backbone", model_cfg=backbone.cfg)
    lm = new_latent_lm(cfg, workdir, tok, mesh)
    save_stage_model(lm, workdir, "sft", kind="latent_lm", model_cfg=lm.model_cfg)


def link_workdir(trained: Path, workdir: Path) -> None:
    """Links a trained workdir's inputs of stage rl into `workdir` (nothing of `trained` is written)."""
    if not (trained / "sft" / "final").is_dir():
        raise FileNotFoundError(f"{trained / 'sft' / 'final'}: --rl-workdir needs a workdir whose sft stage finished")
    workdir.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if (trained / name).exists():
            (workdir / name).symlink_to((trained / name).resolve(), target_is_directory=True)


def random_decoder(cfg: Any) -> Any:
    """A random-init OCR decoder of the config's `codebook:` section (for timing r_proc only)."""
    from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model
    from dlr_jax.stages.codebook.models import LatentDecoder

    model = build_codebook_model(CodebookModelConfig.from_config(cfg), seed=cfg.run.seed)
    return LatentDecoder(model, batch_size=cfg.codebook.eval_batch_size)


def _describe(model: Any) -> tuple[str, int]:
    m, lat = model.model_cfg, model.latent_cfg
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return (f"{m.model_type}, hidden {m.hidden_size}, {m.num_layers} layer{'s' * (m.num_layers != 1)}, "
            f"{m.num_heads} heads / "
            f"{m.num_kv_heads} KV heads, MLP {m.intermediate_size}; vocab {lat.latent_offset} text rows + "
            f"{lat.num_latents} latent rows (d_c {lat.latent_dim})"), n


def bench_rl(cfg: Any, *, steps: int = 3, trained: Path | None = None, process_reward: bool = False,
             config_name: str = "", log: Callable[[str], None] = print) -> RLBenchResult:
    """1 + `steps` RL steps of `stages.rl.run` on a scratch workdir; its per-step metrics."""
    from dlr_jax.stages.rl import stage as rl
    with tempfile.TemporaryDirectory() as tmp:
        w = Path(tmp) / "wd"
        if trained is None:
            random_workdir(cfg, w)
        else:
            link_workdir(trained, w)
        decoder = None
        has_decoder = (w / "codebook" / "final" / "meta.json").is_file()
        if process_reward and not has_decoder and cfg.rl.process_weight != 0:
            decoder = random_decoder(cfg)
        log(f"rl: {1 + steps} RL steps of {cfg.rl.num_prompts} x {cfg.rl.group_size} rollouts on "
            f"{'random init' if trained is None else trained}")
        res = rl.run(cfg, w, num_steps=1 + steps, latent_decoder=decoder)
        model, params = _describe(res.model)
    if len(res.history) != 1 + steps:
        raise RuntimeError(f"stage rl ran {len(res.history)} steps, expected {1 + steps} (preempted={res.preempted})")
    for h in res.history:
        log(f"rl: step {int(h['step'])}: " + ", ".join(f"{p} {h[f'time/{p}']:.2f}s" for p in PHASES)
            + f"; {h['completion_length']:.1f} tokens per rollout")
    r, t = cfg.rl, cfg.train.rl
    return RLBenchResult(
        config=config_name, source="random init" if trained is None else f"trained workdir {trained}", model=model,
        params=params,
        prompts=r.num_prompts, group=r.group_size, max_new_tokens=r.max_new_tokens, max_latents=r.max_latents,
        inner_epochs=r.inner_epochs, batch_size=t.batch_size, beta=r.beta,
        process="reward/process" in res.history[0], history=res.history)


# ----------------------------------------------------------------------------------------------
# Report.


def render_section(res: RLBenchResult, command: str, info: dict[str, str]) -> str:
    warm = res.history[0]
    fmt = lambda key: ", ".join(f"{h[key]:.3f}" for h in res.timed)
    mean = lambda key: float(np.mean([h[key] for h in res.timed]))
    lines = common.header("Latent GRPO step: rollout tokens/s and time split", command, info) + [
        f"Config: `{res.config}` ({res.source}): policy {res.model}, {res.params / 1e6:.2f}M params, fp32. "
        f"One RL step = {res.prompts} prompts x G = {res.group} rollouts (T = 1, at most {res.max_new_tokens} new "
        f"tokens, `</latent>` forced after {res.max_latents} latents), old"
        + (" and reference" if res.beta else "") + " log-probs, rewards (answer + format"
        + (" + process r_proc" if res.process else "; r_proc off: no OCR decoder") + f"), then mu = "
        f"{res.inner_epochs} epochs of {res.updates_per_step // res.inner_epochs} updates of {res.batch_size} "
        f"rollouts ({res.updates_per_step} optimizer steps). Timed by `dlr_jax.stages.rl.stage.run`'s own `time/*` "
        f"metrics; median of {len(res.timed)} steps after one warm-up step (compiles).",
        "",
        "| phase | seconds (median) | share of step | seconds per step | warm-up step s |",
        "|---|---|---|---|---|",
    ]
    for p in PHASES:
        lines.append(f"| {p} | {res.phase_s(p):.3f} | **{100 * res.share(p):.0f}%** | {fmt(f'time/{p}')} "
                     f"| {warm[f'time/{p}']:.3f} |")
    lines += [
        f"| step | {res.med('time/step'):.3f} | 100% | {fmt('time/step')} | {warm['time/step']:.3f} |",
        "",
        f"Rollouts: **{res.tokens_per_s:,.0f} generated tokens/s** (median; {res.rollouts} rollouts x "
        f"{mean('completion_length'):.1f} tokens on average, {mean('n_latents'):.1f} of them latent ids; "
        f"{100 * mean('finished'):.0f}% stopped at `</answer>`/EOS before the budget). Update: "
        f"{res.phase_s('update') / res.updates_per_step:.3f} s per optimizer step, "
        f"{res.inner_epochs * statistics.median(res.rollout_tokens(h) for h in res.timed) / res.phase_s('update'):,.0f}"
        " completion tokens trained per second. Mean reward "
        f"{mean('reward'):.3f}.",
        "",
        f"Interpretation: {interpret(res)}",
    ]
    return "\n".join(lines) + "\n"


def interpret(res: RLBenchResult) -> str:
    top = max(PHASES, key=res.phase_s)
    rest = sorted((p for p in PHASES if p != top), key=res.phase_s, reverse=True)
    text = (f"{top} takes {100 * res.share(top):.0f}% of a GRPO step (then " + ", ".join(
        f"{p} {100 * res.share(p):.0f}%" for p in rest) + "). ")
    full = float(np.mean([h["completion_length"] for h in res.timed])) >= 0.9 * res.max_new_tokens
    if full:
        text += ("Rollouts here run to (nearly) the whole token budget, as an untrained policy's do; a trained "
                 "policy that closes `</answer>` early generates fewer tokens per step, while the sampler's "
                 "loop runs until the last row stops. ")
    if top == "update":
        text += (f"The {res.updates_per_step} optimizer steps (mu = {res.inner_epochs} passes over the rollouts, each "
                 "a forward + backward over full prompt + completion rows) outweigh sampling and scoring: a faster "
                 "train step, or fewer inner epochs, shortens the GRPO step most.")
    elif top == "rollout":
        text += "Sampling bounds the step: rollout tokens/s is the number to raise (batching, shorter budgets)."
    else:
        text += f"{top} dominates, which is unusual: check it before tuning sampling or updates."
    return text


# ----------------------------------------------------------------------------------------------
# CLI hooks (`python -m dlr_jax.bench --only rl`).


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rl-config", type=Path, default=DEFAULT_CONFIG, help="rl benchmark: config (random init)")
    ap.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE",
                    help="rl benchmark: config override (repeatable), e.g. rl.num_prompts=8")
    ap.add_argument("--rl-steps", type=int, default=0,
                    help="rl benchmark: timed RL steps after the warm-up step (0 = --repeats)")
    ap.add_argument("--rl-workdir", type=Path, default=None,
                    help="rl benchmark: a trained workdir to start from (its config.yaml; it is not written)")
    ap.add_argument("--rl-process-reward", action="store_true",
                    help="rl benchmark: time r_proc with a random-init OCR decoder when the workdir has none")


def check_arguments(args: argparse.Namespace) -> str | None:
    if args.rl_steps < 0:
        return f"--rl-steps must be >= 0, got {args.rl_steps}"
    if args.rl_workdir is not None and not (args.rl_workdir / "config.yaml").is_file():
        return f"--rl-workdir {args.rl_workdir}: no config.yaml there (not a dlr_jax workdir)"
    return None


def config_for(args: argparse.Namespace) -> tuple[Any, str]:
    from dlr_jax.config import load_config

    path = args.rl_workdir / "config.yaml" if args.rl_workdir is not None else Path(args.rl_config)
    overrides: Sequence[str] = [*args.rl_set, *FIXED]
    try:
        name = str(path.resolve().relative_to(common.REPO))
    except ValueError:
        name = str(path)
    return load_config(path, overrides), name + "".join(f" --rl-set {o}" for o in args.rl_set)


def run_section(args: argparse.Namespace, command: str, info: dict[str, str],
                log: Callable[[str], None] = print) -> str:
    """Runs the `rl` benchmark and returns its BENCHMARKS.md section."""
    err = check_arguments(args)
    if err:
        raise ValueError(err)
    cfg, name = config_for(args)
    res = bench_rl(cfg, steps=args.rl_steps or args.repeats, trained=args.rl_workdir,
                   process_reward=args.rl_process_reward, config_name=name, log=log)
    return render_section(res, command, info)
