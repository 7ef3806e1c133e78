"""`python -m dlr_jax.bench`: benchmarks that write their own sections of BENCHMARKS.md.

    python -m dlr_jax.bench --out BENCHMARKS.md [--only sampling,compile] [--size small|medium]

One module a benchmark (see the package docstring); each adds its flags here and returns its
section's text, which `common.write_section` puts between the section's markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dlr_jax.bench import codebook, grpo_peers, latent_cost, pack, render_cache, rl, train
from dlr_jax.bench.common import MAX_LOAD, SIZES, load_average, machine_info, write_section
from dlr_jax.bench.compile import bench_compile, render_compile
from dlr_jax.bench.sampling import bench_sampling, render_sampling

BENCHMARKS = ("sampling", "compile", "train", "codebook", "rl", "render_cache", "grpo_peers", "latent_cost", "pack")


def parse_only(spec: str) -> list[str]:
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in BENCHMARKS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown benchmark(s) {bad or spec!r}; choose from {','.join(BENCHMARKS)}")
    return names


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dlr_jax.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"), help="markdown file to update")
    ap.add_argument("--only", type=parse_only, default=None,
                    help=f"comma-separated subset of {','.join(BENCHMARKS)} (default: all; latent_cost only "
                         "when its trained workdir exists, codebook only when the benchmark data is found)")
    ap.add_argument("--size", choices=sorted(SIZES), default="medium",
                    help="model size: " + "; ".join(f"{k}: {v.describe()}" for k, v in SIZES.items()))
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per side (median reported)")
    ap.add_argument("--batch", type=int, default=16, help="prompts per generate call")
    ap.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt")
    ap.add_argument("--new-tokens", type=int, default=128, help="greedy tokens generated per prompt")
    ap.add_argument("--compile-layers", default="4,32", help="shallow,deep layer counts to compile")
    ap.add_argument("--no-unstacked", action="store_true",
                    help="sampling on a GPU: do not also time the unstacked-layer decode loop "
                         "(sampling.unstack_layers=on; its compile grows with depth: 151 s for 8 layers on an H100)")
    ap.add_argument("--allow-load", action="store_true",
                    help=f"write peer ratios even when the load average before the run exceeded {MAX_LOAD} (per 2 "
                         "usable cores): other work on the machine, which would make them measure contention")
    sections = {"train": train, "codebook": codebook, "rl": rl, "render_cache": render_cache, "grpo_peers": grpo_peers,
                "latent_cost": latent_cost, "pack": pack}
    for mod in sections.values():
        mod.add_arguments(ap)
    args = ap.parse_args(argv)
    explicit = args.only is not None
    args.only = args.only or list(BENCHMARKS)
    for name, mod in sections.items():
        if name not in args.only:
            continue
        if err := mod.check_arguments(args):
            ap.error(err)
        if missing := getattr(mod, "missing_inputs", lambda _: None)(args):
            if explicit:
                ap.error(missing)
            # `make bench` on a machine that has not run `make demo` (latent_cost) or has no benchmark data
            # (codebook's GSM8K-Aug CoTs): the other sections still run.
            print(f"{name}: skipped ({missing})", flush=True)
            args.only.remove(name)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    try:
        shallow, deep = (int(x) for x in args.compile_layers.split(","))
    except ValueError:
        ap.error(f"--compile-layers must be two integers like 4,32, got {args.compile_layers!r}")
    size = SIZES[args.size]
    command = " ".join(["python -m dlr_jax.bench", *(argv if argv is not None else sys.argv[1:])])
    if argv is None and os.environ.get("MAKELEVEL"):
        command = f"make bench  (= {command})"
    log = lambda msg: print(msg, flush=True)
    # The load before any benchmark ran gates every section's ratios: a later reading would count this run's
    # own earlier sections (the 1-minute average decays over minutes) and refuse an idle machine's ratios.
    args.start_load = load_average()
    for name in args.only:
        info = machine_info()
        section = grpo_peers.section_name(args) if name == "grpo_peers" else name
        if name == "sampling":
            res = bench_sampling(size, batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                                 repeats=args.repeats, unstacked=not args.no_unstacked, log=log)
            res = dataclasses.replace(res, loads=(args.start_load,))
            body = render_sampling(res, command, info, allow_load=args.allow_load)
            section = "sampling_gpu" if res.device == "gpu" else "sampling"  # both sections can live side by side
        elif name in sections:
            body = sections[name].run_section(args, command, info, log)
        else:
            body = render_compile(bench_compile(size, layers=(shallow, deep), batch=args.batch,
                                                seq=args.prompt_len, repeats=args.repeats, log=log),
                                  command, info)
        write_section(args.out, section, body)
        log(f"{name}: wrote section to {args.out}\n{body}")

