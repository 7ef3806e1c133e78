"""Latent vs CoT cost (issue 16, item 5): what answering costs per question when the model reasons in
latents, in text, or not at all, on one backbone, measured in one run.

    python -m dlr_jax.bench --out BENCHMARKS.md --only latent_cost [--cost-workdir runs/demo/pipeline ...]
        [--cost-questions 256] [--cost-batches 128,1]

`--cost-workdir` is a trained pipeline workdir (what `make demo` leaves in runs/demo/pipeline, or
one seed of `python -m dlr_jax.experiments main`, W/seed0/main); repeat it for several (e.g. a graded
variant of the task), each gets its tables. Its finished stages are loaded:
textsft_direct (Direct-SFT, answers at once), textsft_cot (CoT-SFT, reasons in text), sft (DLR-SFT)
and rl (DLR-Full, when present): the same backbone width and depth, the same tokenizer. Each answers
the same first `--cost-questions` test questions of the workdir's evaluation split with the
evaluation code (`evaluate.evaluate_examples`: greedy, constrained latent decoding, batches sorted by
prompt length). Every method first runs once untimed (it compiles each prompt bucket), then the
methods take turns, repeat by repeat (order reversed every other repeat); a repeat's wall time is its
generate calls' seconds summed over the questions. Medians are reported. Two batch sizes by default:
128 questions a call (throughput: on a CPU the prompt's prefill is compute-bound and costs about as
much per token as a decode step, so the prompt weighs on every method alike) and 1 (latency: one
user's question; the prefill is one parallel pass and the generated tokens dominate).

A bound worth knowing: an answer-first method cannot be cheaper than Direct-SFT on the same prompts
(it generates the answer too, plus its reasoning), so CoT-SFT's wall time over Direct-SFT's caps the
speed-up any latent method can show against CoT on this task. The section prints that cap.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlr_jax.bench import common

DEFAULT_WORKDIR = Path("runs/demo/pipeline")
# (label, stage, evaluation mode), in table order; DLR-Full is left out when the workdir has no rl
# stage, the others (REQUIRED) must be there: Direct-SFT gives the cap, CoT-SFT and DLR-SFT the ratio.
METHODS = (("Direct-SFT", "textsft_direct", "direct"), ("CoT-SFT", "textsft_cot", "cot"),
           ("DLR-SFT", "sft", "latent"), ("DLR-Full", "rl", "latent"))
REQUIRED = ("textsft_direct", "textsft_cot", "sft")


@dataclasses.dataclass
class MethodCost:
    label: str
    stage: str
    mode: str
    pass_at_1: float
    reasoning_len: float  # #L: latent or CoT tokens per question
    tokens: float  # generated tokens per question
    wall: list[float]  # seconds per question, one per timed repeat

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)


@dataclasses.dataclass
class CostResult:
    workdir: str
    questions: int
    batch: int
    repeats: int
    benchmark: str
    split: str
    model: str
    methods: list[MethodCost]
    task: str
    loads: list[float]  # load average before any work (later ones would count this benchmark's own threads)

    def by_label(self, label: str) -> MethodCost | None:
        return next((m for m in self.methods if m.label == label), None)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cost-workdir", type=Path, action="append", default=None,
                    help="latent_cost: a trained pipeline workdir (default make demo's runs/demo/pipeline, or an "
                         "experiment's W/seed0/main); repeat for several")
    ap.add_argument("--cost-questions", type=int, default=256, help="latent_cost: test questions per method")
    ap.add_argument("--cost-batches", default="128,1",
                    help="latent_cost: questions per generate call, one table each (comma-separated)")


def missing_stages(workdir: Path) -> list[str]:
    from dlr_jax.run.workdir import final_dir

    return [s for s in REQUIRED if not (final_dir(workdir, s) / "meta.json").is_file()]


def batch_sizes(spec: str) -> list[int]:
    """"128,1" -> [128, 1]; ValueError for anything but positive integers."""
    out = [int(x) for x in spec.split(",") if x.strip()]
    if not out or min(out) < 1:
        raise ValueError(spec)
    return out


def check_arguments(args: argparse.Namespace) -> str | None:
    try:
        batch_sizes(args.cost_batches)
    except ValueError:
        return f"--cost-batches must be positive integers like 128,1, got {args.cost_batches!r}"
    if args.cost_questions < 1:
        return f"--cost-questions must be >= 1, got {args.cost_questions}"
    return None


def missing_inputs(args: argparse.Namespace) -> str | None:
    """The trained models this section reads, if a workdir lacks them (`make bench` then skips the section)."""
    for wd in workdirs(args):
        if not (wd / "config.yaml").is_file():
            return (f"--cost-workdir {wd}: not a dlr_jax workdir (no config.yaml); run `make demo` first (it "
                    "writes runs/demo/pipeline) or point it at an experiment's W/seed0/main")
        if missing := missing_stages(wd):
            return f"--cost-workdir {wd}: stage(s) {', '.join(missing)} not finished (no final/meta.json)"
    return None


def workdirs(args: argparse.Namespace) -> list[Path]:
    return [Path(w) for w in (args.cost_workdir or [DEFAULT_WORKDIR])]


def bench_latent_cost(workdir: Path, *, questions: int, batch: int, repeats: int,
                      log: Callable[[str], None] = print, load: float | None = None) -> CostResult:
    """`load`: the load average taken before this benchmark's first run (default: now); later readings
    would count the previous tables' own work."""
    from dlr_jax.data.sources import load_examples
    from dlr_jax.eval.evaluate import evaluate_examples
    from dlr_jax.generate.sampler import Sampler
    from dlr_jax.rewards.answer_format import KNOWN_BENCHMARKS
    from dlr_jax.run.handoff import load_stage_model
    from dlr_jax.run.workdir import final_dir

    loads = [common.load_average() if load is None else load]
    present = [m for m in METHODS if (final_dir(workdir, m[1]) / "meta.json").is_file()]
    loaded: dict[str, Any] = {}
    cfg = None
    for label, stage, mode in present:
        model, tok, cfg = load_stage_model(workdir, stage)
        sampler = Sampler(model, rules=cfg.mesh.rules, prompt_bucket=cfg.sampling.prompt_bucket)
        loaded[label] = (tok, sampler, stage, mode)
    assert cfg is not None
    examples = load_examples(cfg, cfg.data.eval_split)[:questions]
    benchmark = cfg.data.dataset if cfg.data.dataset in KNOWN_BENCHMARKS else "gsm8k"  # the scoring rule
    ev = cfg.eval

    def run(label: str) -> Any:
        tok, sampler, _, mode = loaded[label]
        return evaluate_examples(None, tok, examples, benchmark, mode=mode, max_new_tokens=ev.max_new_tokens,
                                 max_latents=ev.max_latents, batch_size=batch, sampler=sampler)

    first: dict[str, Any] = {}
    for label in loaded:  # compiles every prompt bucket of every method
        log(f"[latent_cost] warm-up {label}")
        first[label] = run(label)
    walls: dict[str, list[float]] = {label: [] for label in loaded}
    order = list(loaded)
    for r in range(repeats):
        for label in order if r % 2 == 0 else order[::-1]:
            res = run(label)
            t = res.metrics["timing"]
            walls[label].append(sum(map(sum, t["batch_seconds"])) / len(examples))
            log(f"[latent_cost] repeat {r} {label}: {walls[label][-1] * 1e3:.2f} ms / question")
    methods = []
    for label, (_, _, stage, mode) in loaded.items():
        m = first[label].metrics
        methods.append(MethodCost(label, stage, mode, 100.0 * m["pass_at_1"]["mean"], m["L"]["mean"],
                                  m["gen_tokens"]["mean"], walls[label]))
    mc = cfg.model
    model = (f"{mc.model_type}, hidden {mc.hidden_size}, {mc.num_layers} layers, {mc.num_heads} heads / "
             f"{mc.num_kv_heads} KV heads, MLP {mc.intermediate_size}")
    return CostResult(str(workdir), len(examples), batch, repeats, benchmark, cfg.data.eval_split, model,
                      methods, task_description(cfg.data), loads)


def task_description(d: Any) -> str:
    """The task of a workdir's data section, as its table names it: the synthetic task's settings (the chain
    style when it is not the equations), else the dataset."""
    if d.dataset != "synthetic":
        return d.dataset
    style = "" if d.synthetic_cot_style == "equations" else f", {d.synthetic_cot_style} chains (sentences)"
    return (f"{d.synthetic_min_steps}-{d.synthetic_max_steps} steps, operands up to {d.synthetic_max_operand}, values "
            f"up to {d.synthetic_max_value}{style}")


def render_section(results: list[CostResult], command: str, info: dict[str, str], allow_load: bool = False) -> str:
    out = common.header("Latent vs CoT cost: generated tokens and wall time per question on one backbone",
                        command, info)
    out += [f"Greedy, constrained latent decoding (the evaluation code). Wall time = the generate calls' seconds "
            f"per question, after an untimed run of every method; {results[0].repeats} repeats interleaved, "
            "median.", ""]
    shown = None
    for res in results:
        if res.workdir != shown:
            shown = res.workdir
            out += [f"### `{res.workdir}`", "", f"Backbone: {res.model}; {res.questions} {res.benchmark} questions "
                    f"of split `{res.split}` ({res.task}).", ""]
        out += render_table(res, allow_load)
    return "\n".join(out) + "\n"


def render_table(res: CostResult, allow_load: bool) -> list[str]:
    kind = "throughput" if res.batch > 1 else "latency: one question at a time"
    out = [f"#### Batches of {res.batch} ({kind})", ""]
    cot = res.by_label("CoT-SFT")
    refusal = common.ratio_refusal(res.loads, allow_load)
    out += ["| method | Pass@1 (%) | #L | generated tokens / question | wall ms / question (median) | per repeat | "
            "CoT-SFT / this: #L | tokens | wall |", "|---|---|---|---|---|---|---|---|---|"]
    for m in res.methods:
        per = ", ".join(f"{w * 1e3:.2f}" for w in m.wall)
        if cot is None or m is cot or refusal:
            ratios = "— | — | —" if not refusal or m is cot else "(not written) | | "
        else:
            lr = f"{cot.reasoning_len / m.reasoning_len:.1f}×" if m.reasoning_len > 0 else "—"
            ratios = f"{lr} | {cot.tokens / m.tokens:.1f}× | {cot.wall_median / m.wall_median:.1f}×"
        out.append(f"| {m.label} | {m.pass_at_1:.1f} | {m.reasoning_len:.2f} | {m.tokens:.1f} | "
                   f"{m.wall_median * 1e3:.2f} | {per} | {ratios} |")
    out.append("")
    direct = res.by_label("Direct-SFT")
    loads = ", ".join(f"{x:.2f}" for x in res.loads)
    if refusal:
        out.append(f"Ratios {refusal} (load average before the benchmark: {loads}).")
    elif cot is not None and direct is not None:
        cap = cot.wall_median / direct.wall_median
        out.append(f"Cap on this task: CoT-SFT takes {cap:.1f}× Direct-SFT's wall time per question, and a latent "
                   "method generates the answer as Direct-SFT does plus its latents, so no latent method can be more "
                   f"than ~{cap:.1f}× faster than CoT-SFT here. The prompt (prefill) and the answer cost the same "
                   f"for every method; the CoT's {cot.reasoning_len:.1f} tokens are what a latent method saves. "
                   f"Load average before the benchmark: {loads}.")
    out.append("")
    return out


def run_section(args: argparse.Namespace, command: str, info: dict[str, str],
                log: Callable[[str], None] = print) -> str:
    """Runs the `latent_cost` benchmark and returns its BENCHMARKS.md section."""
    err = check_arguments(args)
    if err:
        raise ValueError(err)
    load = common.start_load(args)  # before any table's work: one reading for all of them
    results = [bench_latent_cost(wd, questions=args.cost_questions, batch=b, repeats=args.repeats, log=log, load=load)
               for wd in workdirs(args) for b in batch_sizes(args.cost_batches)]
    return render_section(results, command, info, allow_load=args.allow_load)
