"""`python -m dlr_jax.evaluate`'s command line: flags, `main` (evaluate or `--aggregate`), and `cli`, which turns a
missing stage or data file into one line (exit 2). The evaluation itself is `dlr_jax.eval.evaluate`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from dlr_jax.config import ConfigError
from dlr_jax.config.stages import ANSWER_FALLBACKS, EVAL_DECODINGS
from dlr_jax.core.sharding import maybe_initialize_distributed
from dlr_jax.data.records import DataFormatError
from dlr_jax.eval.evaluate import MODES, evaluate
from dlr_jax.eval.stats import format_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dlr_jax.evaluate",
        description="Pass@1 and #L of a trained stage on the benchmarks (mean ± std over seeds). Writes "
        "<workdir>/<stage>/eval/results.json (metrics, config, date, git commit) and samples.jsonl (every "
        "prediction), and prints a table.",
        epilog="Settings come from <workdir>/config.yaml, then the eval/sampling sections of --config, then "
        "--set, then the flags. Benchmarks: gsm8k gsm8k_aug gsm_hard svamp multiarith math500 math_train "
        "synthetic, and for a synthetic run its out-of-domain analogues synthetic_hard (numbers x10) and "
        "synthetic_reworded (reworded + an irrelevant sentence); optionally name:split (gsm8k_aug:valid). "
        "Pass@1 is printed in %; std is ddof=0 over seeds; greedy decoding runs once. Defaults are the paper's "
        "reading: greedy (eval.temperature 0), dynamic decoding (the model closes its latent span itself), answers "
        "from the <answer> span only; the other readings are options (see the dlr_jax/eval/evaluate.py docstring).",
    )
    p.add_argument("--workdir", help="the training workdir (required unless --aggregate)")
    p.add_argument("--aggregate", nargs="+", metavar="WORKDIR",
                   help="combine the results.json of these workdirs (e.g. 5 training seeds) into mean ± std "
                   "per benchmark; with --stage, --tag and --out (see dlr_jax/eval/aggregate.py)")
    p.add_argument("--out", help="with --aggregate: also write the combined JSON here")
    p.add_argument("--stage", required=True,
                   help="stage to evaluate: textsft_cot, textsft_direct, textsft_direct_from_cot, align, sft or rl")
    p.add_argument("--benchmarks", help="comma-separated benchmark names (default: eval.benchmarks)")
    p.add_argument("--seeds", type=int, help="seeds (sampling runs) per benchmark (default: eval.seeds)")
    p.add_argument("--limit", type=int, help="only the first N examples of each benchmark (0 = all)")
    p.add_argument("--mode", choices=MODES,
                   help="latent (dynamic latent decoding), cot or direct; default from the stage "
                   "(textsft_cot -> cot, textsft_direct[_from_cot] -> direct, else latent)")
    p.add_argument("--max-latents", type=int, help="cap on latents in dynamic decoding (eval.max_latents)")
    p.add_argument("--force-latents", type=int, metavar="N",
                   help="forced early stop: </latent> right after N latents (replaces the cap)")
    p.add_argument("--decoding", choices=EVAL_DECODINGS,
                   help="dynamic: the paper's, the model closes its latent span and writes text itself (only the "
                   "latent cap applies); constrained: a grammar forces <latent> z.. </latent> <answer> a </answer> "
                   "(default: eval.decoding)")
    p.add_argument("--no-constrain-format", dest="decoding", action="store_const", const="dynamic",
                   help="the same as --decoding dynamic")
    p.add_argument("--answer-fallback", choices=ANSWER_FALLBACKS,
                   help="off: answers only from the <answer> span (the paper's); last_number: without a span, "
                   "the RL answer reward's fallback (boxed, 'answer is', else the last number), counted in the "
                   "results (default: eval.answer_fallback)")
    p.add_argument("--temperature", type=float,
                   help="0 = greedy (the paper's evaluation); > 0 samples, seed s with PRNG seed s "
                   "(default: eval.temperature)")
    p.add_argument("--data-dir", help="data root holding gsm8k/ svamp/ ... (default: $DLR_DATA_DIR, else the "
                   "checkout's ../shared/data, else its data/)")
    p.add_argument("--config", help="YAML whose eval: and sampling: sections replace the workdir's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                   help="config override, e.g. eval.batch_size=16 or eval.temperature=1.0 (repeatable)")
    p.add_argument("--tag", default="", help="write results_<tag>.json / samples_<tag>.jsonl instead")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from dlr_jax.core.compile_cache import enable as enable_compile_cache

    parser = build_parser()
    a = parser.parse_args(argv)
    if a.aggregate:
        from dlr_jax.eval.aggregate import aggregate, format_aggregate

        agg = aggregate(a.aggregate, a.stage, tag=a.tag)
        if a.out:
            Path(a.out).write_text(json.dumps(agg, indent=2) + "\n")
        print(format_aggregate(agg), flush=True)
        return agg
    if not a.workdir:
        parser.error("--workdir is required (or --aggregate W1 W2 ...)")
    maybe_initialize_distributed()  # DLR_COORDINATOR etc.: one command per process, like train
    enable_compile_cache()
    results = evaluate(
        a.workdir, a.stage,
        benchmarks=None if a.benchmarks is None else [b for b in a.benchmarks.split(",") if b],
        seeds=a.seeds, limit=a.limit, max_latents=a.max_latents, force_latents=a.force_latents, mode=a.mode,
        decoding=a.decoding, answer_fallback=a.answer_fallback, temperature=a.temperature, data_dir=a.data_dir,
        config=a.config, overrides=a.overrides,
        tag=a.tag, progress=a.progress,
    )
    if jax.process_index() == 0:  # every process computed the same results: print them once
        print(format_table(results), file=sys.stdout, flush=True)
    return results


def cli(argv: Sequence[str] | None = None) -> None:
    """`python -m dlr_jax.evaluate`: `main`, with a missing stage or data file as one line (exit 2)."""
    from dlr_jax.core.exit_codes import NO_SPACE, REFUSED, no_space_error, no_space_message
    from dlr_jax.core.files import MissingStageError
    from dlr_jax.eval.aggregate import ResultsFileError
    from dlr_jax.run.checkpoint import CheckpointUnreadable

    try:
        main(argv)
    # A missing stage names the command that makes it; a missing data file, the command that downloads it; a damaged
    # final/ the command that rewrites it.
    except (ConfigError, DataFormatError, FileNotFoundError, MissingStageError, ResultsFileError,
            CheckpointUnreadable) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(REFUSED) from None
    except OSError as e:  # a full disk while writing the results: one line, exit code 75 (core/exit_codes.py)
        if no_space_error(e) is None:
            raise
        print(f"error: {no_space_message(e, '.')}", file=sys.stderr)
        raise SystemExit(NO_SPACE) from None


if __name__ == "__main__":
    cli()
