"""Turning an experiment into commands and running them: the public CLIs `python -m dlr_jax.train`
and `python -m dlr_jax.evaluate`, one subprocess per stage, so a dry run prints exactly what runs and
each stage keeps its own resume, lock and config checks."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dlr_jax.config import load_config
from dlr_jax.experiments.variants import PRODUCTS, Experiment

# Per-seed training seeds: the run (data order, init, synthetic data) and every trainer's RNG.
SEEDED = ("run.seed", "train.textsft.seed", "train.textsft_direct.seed", "train.align.seed", "train.sft.seed",
          "train.rl.seed", "codebook.train.seed")
EVAL_PREFIXES = ("eval.", "sampling.")


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of the experiment, with the files whose presence means it is done."""

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


def seed_overrides(seed: int) -> tuple[str, ...]:
    return tuple(f"{k}={seed}" for k in SEEDED)


def seed_dir(root: Path, seed: int) -> Path:
    return root / f"seed{seed}"


def build_steps(exp: Experiment, *, root: Path, config: str, overrides: Sequence[str], seeds: Sequence[int],
                python: str = sys.executable) -> list[Step]:
    """Every command of the experiment, seed by seed and variant by variant: a variant's training commands
    (main first, the others link from it), then the evaluations of its table rows, so a long run's table
    fills in as each variant finishes."""
    logs = root / exp.name / "logs"
    steps: list[Step] = []
    names = {v.name for v in exp.variants}
    for m in exp.methods:
        if m.variant not in names:
            raise ValueError(f"method {m.label!r} reads variant {m.variant!r}, which the experiment does not train")
    evals = [o for o in overrides if o.startswith(EVAL_PREFIXES)]
    benchmarks = tuple(load_config(config, list(overrides)).eval.benchmarks)
    for s in seeds:
        base = seed_dir(root, s) / "main"
        for v in exp.variants:
            w = seed_dir(root, s) / v.name
            links: list[tuple[Path, Path]] = []
            if v.name != "main":
                for stage in v.reuse:
                    links += [(w / p, base / p) for p in PRODUCTS[stage]]
                if v.link_tokenizer:
                    links.append((w / "tokenizer", base / "tokenizer"))
            sets = [*overrides, *v.overrides, *seed_overrides(s)]
            for stage in v.runs:
                argv = [python, "-m", "dlr_jax.train", "--stage", stage, "--config", config, "--workdir", str(w)]
                argv += ["--mode", v.textsft_mode] if stage == "textsft" else []
                for o in sets:
                    argv += ["--set", o]
                steps.append(Step(s, v.name, "train", stage, tuple(argv),
                                  tuple(w / d / "final" / "meta.json" for d in v.done_dirs(stage)), w, tuple(links),
                                  logs / f"seed{s}_{v.name}_{stage}.log"))
            for m in (m for m in exp.methods if m.variant == v.name):
                # --config: its eval section (then the --set ones) is what `benchmarks` below checks for
                argv = [python, "-m", "dlr_jax.evaluate", "--workdir", str(w), "--stage", m.stage, "--config", config,
                        "--no-progress"]
                if m.force_latents is not None:
                    argv += ["--force-latents", str(m.force_latents), "--tag", m.tag]
                for o in evals:
                    argv += ["--set", o]
                name = f"results_{m.tag}.json" if m.tag else "results.json"
                steps.append(Step(s, m.variant, "evaluate", m.stage + (f":{m.tag}" if m.tag else ""), tuple(argv),
                                  (w / m.stage / "eval" / name,), w,
                                  log=logs / f"seed{s}_{m.variant}_eval_{m.stage}{'_' + m.tag if m.tag else ''}.log",
                                  benchmarks=benchmarks))
    return _dedupe(steps)


def _dedupe(steps: list[Step]) -> list[Step]:
    """The same evaluation can back two rows (e.g. DLR-Full and K = config's K): run it once."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for st in steps:
        if st.argv not in seen:
            seen.add(st.argv)
            out.append(st)
    return out


def make_links(step: Step) -> None:
    """Relative symlinks to the seed's main workdir (the tree can move); a link that already points
    where it should is kept, anything else in its place is an error rather than silently replaced."""
    for link, target in step.links:
        if not target.exists():
            raise FileNotFoundError(f"{target}: {step.variant} reuses it, but the main variant has not made it")
        rel = os.path.relpath(target, link.parent)
        if link.is_symlink():
            if os.readlink(link) == rel:
                continue
            raise FileExistsError(f"{link} links to {os.readlink(link)}, expected {rel}")
        if link.exists():
            raise FileExistsError(f"{link} exists and is not a link to {target}: move it away to reuse main's")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(rel)


def dry_run(steps: Sequence[Step], out: Callable[[str], None] = print) -> None:
    linked: set[Path] = set()
    for i, st in enumerate(steps, 1):
        state = "done" if st.is_done() else "todo"
        out(f"# [{i}/{len(steps)}] seed {st.seed} {st.variant}: {st.kind} {st.stage} ({state})")
        for link, target in st.links:
            if link not in linked:  # every step of a variant carries its links; print them once
                linked.add(link)
                out(f"#   link {link} -> {target}")
        out(st.shell())


def child_env() -> dict[str, str]:
    """Children import the dlr_jax this runner is (a worktree shadowing an installed copy)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_steps(steps: Sequence[Step], *, after_results: Callable[[int], None] | None = None,
              out: Callable[[str], None] = print) -> int:
    """Runs every step that is not done, in order; returns 0, or the failing command's exit code
    (143 when stopped by SIGTERM/SIGINT: the running stage saved a checkpoint; rerun to resume).
    `after_results(s)` runs after the evaluations of each variant of seed s and at the end of the seed
    (the report is rewritten then)."""
    child: list[subprocess.Popen] = []
    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:  # the stage saves a checkpoint on SIGTERM and exits
        stopping.append(signum)
        for c in child:
            c.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    t_start = time.perf_counter()
    ran = False  # since the last report
    try:
        for i, st in enumerate(steps, 1):
            head = f"[experiments {i}/{len(steps)}] seed {st.seed} {st.variant}: {st.kind} {st.stage}"
            if not st.is_done():
                ran = True
                make_links(st)
                assert st.log is not None
                st.log.parent.mkdir(parents=True, exist_ok=True)
                out(f"{head} ... (log {st.log}; {time.strftime('%H:%M:%S')})")
                t0 = time.perf_counter()
                with open(st.log, "a") as log:
                    log.write(f"$ {st.shell()}\n")
                    log.flush()
                    p = subprocess.Popen(list(st.argv), stdout=log, stderr=subprocess.STDOUT, env=child_env())
                    child[:] = [p]
                    rc = p.wait()
                    child.clear()
                if stopping:
                    out(f"{head}: stopped by a signal (exit {rc}); rerun the same command to resume")
                    return 143
                if rc != 0:
                    out(f"{head}: FAILED (exit {rc}) after {time.perf_counter() - t0:.0f}s; last lines of {st.log}:\n"
                        f"{_tail(st.log)}")
                    return rc
                if not st.is_done():
                    what = f" with benchmarks {', '.join(st.benchmarks)}" if st.benchmarks else ""
                    out(f"{head}: exited 0 but {', '.join(map(str, st.done_files))}{what} is missing; see {st.log}")
                    return 1
                out(f"{head}: done in {time.perf_counter() - t0:.0f}s "
                    f"(total {(time.perf_counter() - t_start) / 60:.1f} min)")
            else:
                out(f"{head}: done earlier, skipping")
            last_of_seed = i == len(steps) or steps[i].seed != st.seed
            evaluated = ran and st.kind == "evaluate" and (last_of_seed or steps[i].kind != "evaluate")
            if (last_of_seed or evaluated) and after_results is not None:
                after_results(st.seed)
                ran = False
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 0
