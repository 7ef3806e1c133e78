"""`python -m dlr_jax.experiments NAME --seeds 3 --workdir W [--config C] [--set k=v ...]`

The paper's comparisons as one resumable command. Experiments:

  main               Direct-SFT, CoT-SFT, DLR-SFT, DLR-Full (DLR-SFT + latent GRPO), one backbone;
                     --matched-baselines adds both text baselines trained on DLR-SFT's budget, and the
                     control Direct-SFT from CoT-SFT (what DLR-SFT's start gives without latents)
  no_align           DLR-Full without the align stage (sft starts from fresh projectors)
  no_rl              DLR-Full vs DLR-SFT
  no_process_reward  latent GRPO with rl.process_weight=0
  forced_stop        DLR-Full with </latent> forced after n latents (--force-stops, default 2,4,6,8)
  k_sweep            codebook size K (--k-values; default the paper's grid 2.5K, 5K, 10K, 20K, 40K as K/4, K/2,
                     K, 2K, 4K of the config), codebook onwards per K; k_sweep.png
  half_font          CoTs rendered at half the font size (smaller canvas, fewer visual tokens N)
  ablations          all of the above ablations in one table (and w/o SFT: RL right after align)
  stages             the paper's stage table: -Align, -SFT (RL right after align), -RL, -Proc, Full
  decoding           the paper's decoding table: dynamic vs </latent> forced after n in 4, 6, 8, 10 latents
  levers             the small-scale levers against main's DLR-SFT, one change each: align x4, the sft dual
                     branch off / weight x4, d_c x4, a larger canvas (more visual tokens N), width x2 and
                     depth x2 (these two with their own Direct-SFT / CoT-SFT); RL on top is main's DLR-Full,
                     and again at a tenth of the RL learning rate (rl alone)
  encoder            the paper's encoder table: DeepEncoder V2 vs Qwen3-VL's vision tower (codebook.encoder),
                     each at the default and at half the font size, codebook onwards per row; the tower comes
                     from --encoder-from DIR, else from a qwen3_vl backbone's init_from

Layout: W/seed<s>/<variant>/ is an ordinary dlr_jax workdir per training seed and variant
(`main` runs every stage; other variants link the stages they share with it and run the rest);
W/NAME/ holds results.json, table.md, the PNG plots and logs/ (one log per stage command). stages, k_sweep,
decoding and encoder print their table in the paper's layout too (each benchmark's Acc. and #L, then the average), with
the paper's numbers beside ours where dlr_jax/experiments/paper_numbers.py has them for the config's backbone.
Each stage runs as `python -m dlr_jax.train ...` / `python -m dlr_jax.evaluate ...` in a subprocess;
a command is skipped once its outputs exist and a stopped stage resumes, so rerunning the same
command continues where it stopped. `--dry-run` prints every command (and whether it is done).
The report (results.json, table.md, plots) is rewritten as each variant's rows are evaluated;
`--report-only` rebuilds it from what exists. Seeds can run on several machines: `--seed-ids 1,2`
runs only those seeds, and `--merge OTHER/NAME/results.json` folds another machine's seeds into
this run's table.

Any backbone config works: `--config configs/qwen3-4b.yaml --set init_from=weights/qwen3-4b` is the
full-scale run (its eval section's benchmarks become the table's benchmarks).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from dlr_jax.experiments.plan import EXPERIMENTS, experiment

DEFAULT_CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


PLACEHOLDER = "W"  # --dry-run without --workdir: the commands name the root W


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlr_jax.experiments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=EXPERIMENTS, help="the experiment")
    p.add_argument("--workdir", help="root of every workdir of the experiment (W); required but with --dry-run, "
                                     "whose commands then show W")
    p.add_argument("--seeds", type=int, help="training seeds 0..N-1 (default 3)")
    p.add_argument("--seed-ids", type=_ints, metavar="S,S,...",
                   help="run these training seeds instead of 0..N-1, e.g. 1,2 on a second machine while "
                        "another runs 0; --merge folds the runs into one table")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config (default configs/tiny.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every stage (repeatable), e.g. latent.source=codebook")
    p.add_argument("--k-values", type=_ints, help="K sweep values, e.g. 128,512,2048 (the config's K is added; "
                                                 "default the paper's grid around the config's K: K/4, K/2, K, 2K, 4K)")
    p.add_argument("--force-stops", type=_ints,
                   help="forced-stop n values (default: the paper's 4,6,8,10 for decoding, 2,4,6,8 for forced_stop)")
    p.add_argument("--matched-baselines", action="store_true",
                   help="main only: also train Direct-SFT and CoT-SFT on as many examples as DLR-SFT's model "
                        "saw (CoT-SFT + align + SFT), two more rows and the gap between them; without it "
                        "DLR-SFT vs Direct-SFT mixes the latents with DLR-SFT's longer training. From-scratch "
                        "backbones get a third row, Direct-SFT trained from the CoT-SFT model for align + SFT's "
                        "examples at SFT's optimizer settings, and DLR-SFT minus it (paired)")
    p.add_argument("--encoder-from", metavar="DIR",
                   help="encoder only: the HF qwen3_vl checkpoint directory whose vision tower the Qwen3-VL rows "
                        "import (codebook.encoder_from); default: init_from when the backbone is a qwen3_vl "
                        "checkpoint; '' trains the tower from scratch")
    p.add_argument("--merge", action="append", default=[], metavar="RESULTS_JSON",
                   help="fold the seeds of another run of this experiment and recipe into the report "
                        "(its W/NAME/results.json, e.g. from --seed-ids on another machine; repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the commands per seed and variant; run nothing")
    p.add_argument("--report-only", action="store_true", help="rewrite results.json / table.md / plots only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dlr_jax.config import ConfigError, load_config
    from dlr_jax.experiments import report, runner, tables

    if args.workdir is None and not args.dry_run:
        print("error: --workdir W is required (the root of every workdir of the experiment); only --dry-run "
              "runs without one", file=sys.stderr)
        return 2
    if args.seeds is not None and args.seed_ids is not None:
        print("error: give --seeds N (seeds 0..N-1) or --seed-ids, not both", file=sys.stderr)
        return 2
    if args.seeds is not None and args.seeds < 1:
        print("error: --seeds must be >= 1", file=sys.stderr)
        return 2
    if args.seed_ids is not None and (not args.seed_ids or min(args.seed_ids) < 0
                                      or len(set(args.seed_ids)) != len(args.seed_ids)):
        print(f"error: --seed-ids must name distinct seeds >= 0, got {args.seed_ids}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        exp = experiment(args.name, cfg, ks=args.k_values, force_stops=args.force_stops,
                         matched=args.matched_baselines, encoder_from=args.encoder_from)
        if exp.needs and not (args.dry_run or args.report_only):
            raise ValueError(f"{exp.name}: {exp.needs}")
        recipe = report.recipe_hash(cfg)

        def merged() -> list[tuple[Path, dict]]:  # read again for every report: the other machine goes on
            return [(Path(f), report.load_merge(Path(f), exp, config=args.config, overrides=args.overrides,
                                                recipe=recipe)) for f in args.merge]

        merged()
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    root = Path(args.workdir or PLACEHOLDER)
    seeds = sorted(args.seed_ids) if args.seed_ids is not None else list(range(args.seeds or 3))
    steps = runner.build_steps(exp, root=root, config=args.config, overrides=args.overrides, seeds=seeds)
    given = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--report-only"]
    command = shlex.join(["python", "-m", "dlr_jax.experiments", *given])  # the command that makes these results
    if args.dry_run:
        print(f"# experiment {exp.name}: {exp.description}; {len(exp.variants)} variant(s) x {len(seeds)} seed(s), "
              f"{len(steps)} commands")
        if exp.needs:
            print(f"# NOTE: before it can run, {exp.needs}")
        if args.workdir is None:
            print(f"# {PLACEHOLDER} = the experiment's --workdir (none given)")
        runner.dry_run(steps)
        return 0
    out_dir = root / exp.name

    def write_report(_seed: int | None = None) -> None:
        from dlr_jax.experiments import plots

        try:
            merge = merged()
        except ValueError as e:  # a merged file went bad while this run went on: report this run's seeds
            print(f"[experiments] warning: {e}; the report leaves the merged files out", flush=True)
            merge = []
        res = report.build(exp, root=root, seeds=seeds, command=command, config=args.config,
                           overrides=args.overrides, steps_done=sum(s.is_done() for s in steps),
                           steps_total=len(steps), merge=merge, recipe=recipe)
        tables.write(res, out_dir)
        made = plots.write_plots(res, out_dir)
        print(f"[experiments] wrote {out_dir / 'results.json'}, {out_dir / 'table.md'}"
              + "".join(f", {p.name}" for p in made), flush=True)

    if args.report_only:
        write_report()
        return 0
    print(f"[experiments] {exp.name}: {len(exp.variants)} variant(s) x {len(seeds)} seed(s), {len(steps)} commands "
          f"({sum(s.is_done() for s in steps)} done); workdirs under {root}", flush=True)
    rc = runner.run_steps(steps, after_results=write_report, out=lambda s: print(s, flush=True))
    if rc == 0:
        print((out_dir / "table.md").read_text(), flush=True)
    return rc
