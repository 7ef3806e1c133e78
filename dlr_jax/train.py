"""`python -m dlr_jax.train --stage S --config C --workdir W [--set k=v ...]`

Stages (README "CLI overview"), each reading the previous stage's final checkpoint from the same workdir:
  codebook  render CoTs, train encoder + VQ + OCR decoder (or fine-tune DeepSeek-OCR-2: codebook.init_from)
  export    write latents/<split>.jsonl with each example's latent ids
  textsft   text-only baselines: CoT-SFT and Direct-SFT (--mode cot|direct|both; direct_from_cot: a control)
  align     backbone frozen, train the latent projectors on [z ; y]
  sft       [x ; <latent> z </latent> <answer> a </answer>], everything trains
  rl        latent GRPO (answer, format and process rewards)
  all       every available stage in order

Runs resume: rerunning the same command continues from the last checkpoint of the stage.

`python -m dlr_jax.train --print-config --config C [--set k=v ...]` prints the fully resolved config
(`base:` includes and overrides applied) as YAML and exits: what a run with those arguments would use.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dlr_jax.config import Config, ConfigError, dump_config, load_config
from dlr_jax.core import preemption
from dlr_jax.core.exit_codes import NO_SPACE, REFUSED, no_space_error, no_space_message
from dlr_jax.core.files import MissingStageError
from dlr_jax.data.records import DataFormatError
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.run.checkpoint import CheckpointUnreadable, settle_background_writes
from dlr_jax.run.preflight import check_counts, check_lengths, check_rates
from dlr_jax.run.workdir import RunRefused, WorkdirLocked, open_run

STAGES = ("codebook", "export", "textsft", "align", "sft", "rl", "all")


def resolve_config(config: str | None, workdir: str, overrides: list[str]) -> Config:
    """--config wins; else the workdir's recorded config (resuming). Neither is an error: a mistyped workdir
    must not start the built-in defaults on a cluster (launch scripts pass no --config for CONFIG `-`)."""
    recorded = Path(workdir) / "config.yaml"
    if config is None and recorded.is_file():
        return load_config(recorded, overrides)
    cfg = load_config(config, overrides)  # the overrides' keys are checked either way
    if config is None:
        raise ConfigError(f"{recorded} does not exist (no stage has run in {workdir}) and no --config was given: "
                          "pass --config for a workdir's first stage (a launch script's CONFIG, not -)")
    return cfg


def run_stage(stage: str, cfg: Config, workdir: str, *, mode: str = "both", steps: int | None = None) -> None:
    if stage == "textsft":
        from dlr_jax.stages import textsft
        for m in ("cot", "direct") if mode == "both" else (mode,):
            textsft.run(cfg, workdir, m, num_steps=steps)
            if preemption.requested():  # saved; start nothing else (exit code 143/130)
                return
    elif stage == "align":
        from dlr_jax.stages import align
        align.run(cfg, workdir, num_steps=steps)
    elif stage == "sft":
        from dlr_jax.stages import sft
        sft.run(cfg, workdir, num_steps=steps)
    elif stage == "codebook":
        from dlr_jax.stages.codebook import stage as codebook

        codebook.run(cfg, workdir, num_steps=steps)
    elif stage == "export":
        from dlr_jax.stages import export

        export.run(cfg, workdir, num_steps=steps)
    elif stage == "rl":
        from dlr_jax.stages.rl import stage as rl

        rl.run(cfg, workdir, num_steps=steps)
    elif stage == "all":
        order = ["textsft", "align", "sft", "rl"]
        if cfg.latent.source == "codebook":
            order = ["codebook", "export", *order]
        for s in order:  # a rerun resumes each stage from its checkpoints (finished ones are quick)
            run_stage(s, cfg, workdir, mode=mode, steps=None)
            if preemption.requested():
                return
    else:
        raise SystemExit(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")


def _process_index() -> int:
    import jax

    return jax.process_index()


def _init_from_note(cfg: Config) -> str:
    """YAML comment lines: with `init_from` the backbone's architecture is the checkpoint's config.json, not
    the model section printed above (of which only the run keys apply): the values a run will build."""
    if not cfg.init_from:
        return ""
    import dataclasses

    from dlr_jax.config.model import RUN_MODEL_KEYS
    from dlr_jax.models.hf_config import model_config_from_hf  # not stages.common: --print-config loads no jax

    if Path(cfg.init_from).suffix.lower() == ".gguf":
        return (f"# init_from: a GGUF file; the first stage converts it into <workdir>/init_from/"
                f"{Path(cfg.init_from).stem} and runs from that folder (python -m dlr_jax.convert --from-gguf)\n")
    try:
        arch = model_config_from_hf(cfg.init_from, **cfg.model.run_keys())
    except (OSError, ValueError) as e:  # a missing or unreadable config.json: the stage says so when it runs
        return f"# init_from: {cfg.init_from}/config.json not read ({e})\n"
    diff = [f"{f.name}: {getattr(arch, f.name)!r}" for f in dataclasses.fields(arch)
            if f.name not in RUN_MODEL_KEYS and getattr(arch, f.name) != getattr(cfg.model, f.name)]
    lines = [f"# init_from: the backbone is {cfg.init_from}/config.json's architecture; of the model section above "
             f"only {', '.join(RUN_MODEL_KEYS)} apply. The checkpoint's values where they differ "
             "(vocab_size grows if the tokenizer adds tokens):", *(f"#   model.{d}" for d in diff)]
    return "\n".join(lines) + "\n"


def _multi_process() -> bool:
    return bool(os.environ.get("DLR_COORDINATOR"))  # sharding.maybe_initialize_distributed's switch


def _say_refused(problem: str) -> None:
    who = f"process {os.environ.get('DLR_PROCESS_ID', '?')}: " if _multi_process() else ""
    print(f"error: {who}{problem}", file=sys.stderr, flush=True)


def _gguf_init_from(cfg: Config, args: argparse.Namespace) -> tuple[Config, str | None, Exception | None]:
    """`init_from=FILE.gguf`: the file converted into <workdir>/init_from/<stem> (once per workdir, by whichever
    stage runs first, codebook included, so that every stage records the same init_from: the folder) and the run
    goes on from that folder. (cfg, problem, exception) as `_init_from_problem` says them."""
    if not cfg.init_from or not Path(cfg.init_from).is_file():
        return cfg, None, None
    import dataclasses

    from dlr_jax.convert.gguf import converted_for_run, is_gguf_file

    if not is_gguf_file(cfg.init_from):
        return cfg, None, None  # check_init_from says what a file there means
    try:
        folder = converted_for_run(cfg.init_from, args.workdir)
    except ConversionError as e:
        return cfg, f"init_from: {e}", None
    except Exception as e:  # noqa: BLE001 - re-raised after the vote, on this process
        return cfg, f"init_from: {type(e).__name__}: {e}", e
    return dataclasses.replace(cfg, init_from=str(folder)), None, None


def _init_from_problem(cfg: Config, args: argparse.Namespace) -> tuple[str | None, Exception | None]:
    """What `check_init_from` refuses (None: nothing), and the exception when it was not a ConfigError (an
    unreadable file, a malformed config.json): the vote must be reached either way, or the others wait for it."""
    from dlr_jax.stages.common import check_init_from

    try:
        check_init_from(cfg, args.stage, args.workdir, args.mode)
    except ConfigError as e:
        return str(e), None
    except Exception as e:  # noqa: BLE001 - re-raised after the vote, on this process
        return f"init_from: {type(e).__name__}: {e}", e
    return None, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dlr_jax.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--stage", choices=STAGES, help="the stage to run (required unless --print-config)")
    ap.add_argument(
        "--config", help="YAML config (configs/tiny.yaml, ...); default: the workdir's config.yaml"
    )
    ap.add_argument("--workdir", help="run directory shared by all stages (required unless --print-config)")
    ap.add_argument("--print-config", action="store_true",
                    help="print the fully resolved config as YAML and exit (needs no --stage/--workdir)")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.sft.learning_rate=3e-4 (repeatable)",
    )
    ap.add_argument("--mode", default="both", choices=("cot", "direct", "both", "direct_from_cot"),
                    help="textsft variant(s): cot = CoT-SFT, direct = Direct-SFT, both; direct_from_cot = a control, "
                         "Direct-SFT (train.textsft_direct settings) starting from this workdir's CoT-SFT model")
    ap.add_argument("--steps", type=int, default=None,
                    help="train the stage up to this global step (not this many more) and finish it there: its "
                         "final model is written (default: the config's; codebook: main-phase steps after its "
                         "warm-ups; rl: RL steps; ignored by export and --stage all)")
    args = ap.parse_args(argv)
    if not args.print_config and (args.stage is None or args.workdir is None):
        ap.error("--stage and --workdir are required (unless --print-config)")
    if args.mode == "direct_from_cot" and args.stage != "textsft":
        ap.error("--mode direct_from_cot is a textsft control: run it as its own --stage textsft, after CoT-SFT")
    if args.print_config and args.config is None and args.workdir is None:
        ap.error("--print-config needs --config (or --workdir of a run, to print its recorded config)")
    problem, unexpected = None, None  # a refusal, and the exception behind it when not a ConfigError
    try:
        if args.print_config and args.workdir is None:
            cfg = load_config(args.config, args.overrides)
        else:
            cfg = resolve_config(args.config, args.workdir, args.overrides)
        check_counts(cfg, args.steps)  # before anything is written (preflight.py)
        check_rates(cfg)
        check_lengths(cfg)
    except ConfigError as e:
        if args.print_config or not _multi_process():
            print(f"error: {e}", file=sys.stderr)
            return REFUSED
        problem = str(e)  # a multi-process run refuses on every process together (below)
    except Exception as e:  # an unreadable config file: the others must not wait for this process either
        if args.print_config or not _multi_process():
            raise
        problem, unexpected = f"{type(e).__name__}: {e}", e
    if args.print_config:
        sys.stdout.write(dump_config(cfg) + _init_from_note(cfg))
        return 0
    import jax

    from dlr_jax.core.compile_cache import enable as enable_compile_cache
    from dlr_jax.core.sharding import (  # jax only now: not --print-config
        all_processes_ok,
        maybe_initialize_distributed,
        processes_not_ok,
    )

    with preemption.handling_signals():  # from here on SIGTERM/SIGINT save and stop (preemption.py)
        # the config and the checkpoint's files, before anything is written, on every process: a host may lack
        # them (or hold another config.yaml), and the others must then stop too instead of waiting for it at the
        # first collective until a timeout. A refusal is said at once, in case joining the others fails.
        if problem is not None:
            _say_refused(problem)
        maybe_initialize_distributed()
        if problem is None:
            cfg, problem, unexpected = _gguf_init_from(cfg, args)
        if problem is None:
            problem, unexpected = _init_from_problem(cfg, args)
            if problem is not None:
                _say_refused(problem)
        multi = _multi_process() or jax.distributed.is_initialized()
        refused = processes_not_ok(problem is None) if multi else ([0] if problem is not None else [])
        if refused:
            if unexpected is not None:  # its traceback too (exit 1): a bug or a broken file, not a config
                raise unexpected
            if problem is None:
                print(f"error: process(es) {', '.join(map(str, refused))} of this run refused it (their logs say "
                      "why); stopping here too", file=sys.stderr)
            return REFUSED
        enable_compile_cache()  # GPU/TPU: a rerun or the next stage reuses compiled steps (compile_cache.py)
        try:  # one writer per workdir; config changes refused before anything is written (workdir.py)
            with open_run(cfg, args.workdir, lock=_process_index() == 0, vote=all_processes_ok):
                run_stage(args.stage, cfg, args.workdir, mode=args.mode, steps=args.steps)
        # one line says it all (file:line, keys; a missing input names the command that makes it; an unreadable
        # or misshapen checkpoint tensor names the file)
        except (WorkdirLocked, RunRefused, ConfigError, DataFormatError, MissingStageError, ConversionError,
                CheckpointUnreadable) as e:
            print(f"error: {e}", file=sys.stderr)
            return preemption.exit_code() or REFUSED  # a stop asked meanwhile keeps its code: the scheduler requeues
        except Exception as e:
            # a full disk or a spent quota, wherever it was written (checkpoint, metrics, export, render cache): one
            # line, and a code that says resuming after freeing space is safe (exit_codes.py)
            if no_space_error(e) is None:
                raise
            settle_background_writes()
            print(f"error: {no_space_message(e, args.workdir)}", file=sys.stderr, flush=True)
            return NO_SPACE
    code = preemption.exit_code()
    if code:
        print(f"[dlr_jax] stopped by a signal after saving; exit code {code}. Rerun the same command to "
              "resume.", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
