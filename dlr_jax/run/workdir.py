"""The workdir: its layout, one writer at a time, and a record that always says what ran in it.

`open_run(cfg, workdir)` is what `python -m dlr_jax.train` does before any stage writes a file:

1. **The lock.** `<workdir>/.lock` is created exclusively (O_CREAT|O_EXCL, atomic on local and NFS v3+
   file systems) and holds the writer's pid, host and start time. A second run on the same workdir
   fails at once with `WorkdirLocked` naming the holder. A lock whose pid is dead on this host is
   stale (a kill -9) and is taken over with a note; a lock held from another host cannot be checked
   from here, so the error says which host holds it and that the file may be deleted if that run is gone.
   The run that holds the lock removes the temporary files a killed atomic write left (`remove_stale_temps`).
2. **The config check.** The run's resolved config is compared with the workdir's `config.yaml`
   before anything is written. Keys that change what was built or read (the model, tokenizer, data,
   latent rows, the codebook networks, `init_from`) are always refused: checkpoints and the tokenizer
   in the workdir belong to the old values. Other keys (learning rates, step counts, intervals,
   sampling, evaluation, the mesh) are refused too unless `run.allow_config_change=true`; then each
   allowed change is appended to `<workdir>/config_changes.jsonl`, so the record says which steps
   ran under which values. Keys no training step reads (eval.*, a stage's progress bar) change without
   the flag and are logged the same way. A workdir that holds nothing but its config.yaml (a first run
   refused before it made anything) binds nothing: a corrected command replaces the recorded config.

Multi-process runs: only process 0 takes the lock and checks the config (the others write through
it); with a `vote`, every process learns whether process 0 started, so none waits alone at the first
collective for a process that exited with an error.

The layout, which every stage, evaluation and export agree on:

    <workdir>/config.yaml  tokenizer/  latents/<split>.jsonl
    <workdir>/<stage>/checkpoints/<step>/  final/  metrics.jsonl  events/  eval/
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dlr_jax.config import Config, ConfigError, load_config, to_dict
from dlr_jax.core.files import TEMP_NAME, MissingStageError

# ------------------------------------------------------------------------------------------------
# The layout.

STAGE_DIRS = {
    "textsft_cot": "textsft_cot",
    "textsft_direct": "textsft_direct",
    "textsft_direct_from_cot": "textsft_direct_from_cot",
    "align": "align",
    "sft": "sft",
    "rl": "rl",
}


def stage_dir(workdir: str | Path, stage: str) -> Path:
    return Path(workdir) / STAGE_DIRS.get(stage, stage)


def final_dir(workdir: str | Path, stage: str) -> Path:
    """Where a finished stage's model lives (`handoff.save_stage_model`)."""
    return stage_dir(workdir, stage) / "final"


def workdir_config(workdir: str | Path) -> Config:
    """The config the workdir's runs recorded (config.yaml)."""
    f = Path(workdir) / "config.yaml"
    if not f.is_file():
        raise MissingStageError(f"{f}: not found — is {workdir} a dlr_jax workdir? (`python -m dlr_jax.train "
                                f"--config C --stage S --workdir {workdir}` makes one)")
    return load_config(f)


# ------------------------------------------------------------------------------------------------
# One writer, and what it may change.

LOCK_NAME = ".lock"
CHANGES_NAME = "config_changes.jsonl"

# Key prefixes (dotted) whose change invalidates what the workdir holds: refused even with
# run.allow_config_change=true. Everything else is a "safe" change.
UNSAFE_PREFIXES = ("model.", "tokenizer.", "data.", "latent.", "init_from")
# latent.dual_branch(_weight): only sft reads them (whether its OCR branch trains), never the latents or checkpoints
# of the stages before it, so an OCR-2 codebook's workdir can turn the branch off before sft. latent.curriculum(_*):
# likewise only sft's rows, so a curriculum can be tried on a workdir whose align stage ran without one. data.pad_to:
# how wide padded rows are, not what they hold (the loss is the same). data.pack(_batch): how the next stage lays out
# its rows (a finished stage's model does not depend on it); a stage stopped part way resumes only onto the same kind
# of data position, which the data iterator checks (`data.stage_data.StageIterator.set_state`).
SAFE_IN_UNSAFE = ("data.num_workers", "data.pad_to", "data.pack", "model.remat", "model.attention", "model.dtype",
                  "latent.dual_branch", "latent.curriculum")
# Keys no training stage reads (the evaluation's settings): a change is recorded but needs no flag, so adding a
# benchmark to a run that is still training (python -m dlr_jax.experiments ... --set eval.benchmarks=[...]) resumes.
TRAINING_NEUTRAL = ("eval.",)
# Display, measurement and checkpointing settings (a stage's progress bar, its profiler window, how often it logs and
# saves, how many checkpoints it keeps: TrainConfig.progress / profile_steps / log_every / checkpoint_every /
# keep_checkpoints / async_checkpointing): no step's result depends on them (a resume is bit-exact from any checkpoint),
# so changing one on resume needs no flag either: launch/profile.sh sets the window on a copy of a workdir's config,
# and a run on preemptible machines may want to save more often. Exact keys: another setting that happens to end in
# "progress" is not exempt.
NO_RESULT = re.compile(r"(train\.[a-z_]+|codebook\.train)\."
                       r"(progress|profile_steps|log_every|checkpoint_every|keep_checkpoints|async_checkpointing)")
# Codebook keys that are training knobs, not the networks or the corpus they read.
CODEBOOK_SAFE = ("codebook.train.", "codebook.sigma", "codebook.lambda_vq", "codebook.beta", "codebook.alpha_steps",
                 "codebook.warmup", "codebook.char_dropout", "codebook.kmeans", "codebook.dead_code",
                 "codebook.eval_", "codebook.export_splits", "codebook.remat", "codebook.dtype")
# Keys whose value changes no result: a render cache is checked (corpus, settings, seed) to hold the very images
# drawing them would give, pixel for pixel; `codebook.pretrained` only decides whether the codebook stage may start
# without codebook.init_from (workdirs made before the key existed recorded false). Adding or dropping one needs no
# flag (the change is still logged).
SAME_RESULTS = ("codebook.render_cache", "codebook.pretrained")
IGNORED = ("run.workdir", "run.allow_config_change")


class WorkdirLocked(RuntimeError):
    """Another process holds the workdir's lock."""


class ConfigChangeRefused(ConfigError):
    """The run's config differs from the workdir's config.yaml in keys it may not change."""


# ------------------------------------------------------------------------------------------------
# The lock.


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def read_lock(workdir: str | Path) -> dict[str, Any] | None:
    f = Path(workdir) / LOCK_NAME
    try:
        return json.loads(f.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, OSError):
        return {"pid": None, "host": "?", "started": "?", "corrupt": True}


class WorkdirLock:
    """An exclusive lock on a workdir; `release()` removes the file if it is still ours."""

    def __init__(self, workdir: str | Path):
        self.path = Path(workdir) / LOCK_NAME
        self.held = False

    def acquire(self) -> WorkdirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        for _ in range(3):  # a stale lock removed by us (or a racing run) is retried
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_lock(self.path.parent)
                if holder is None:
                    continue  # released between our open and read
                if holder.get("host") == me["host"] and isinstance(holder.get("pid"), int) \
                        and not _pid_alive(holder["pid"]):
                    print(f"[dlr_jax] {self.path}: stale lock of pid {holder['pid']} (not running on this host); "
                          "taking it over", flush=True)
                    with contextlib.suppress(FileNotFoundError):
                        self.path.unlink()
                    continue
                raise WorkdirLocked(_locked_message(self.path, holder)) from None
            with os.fdopen(fd, "w") as fh:
                json.dump(me, fh)
            self.held = True
            return self
        raise WorkdirLocked(f"{self.path}: could not take the lock (it keeps coming back); is another run starting?")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        holder = read_lock(self.path.parent)
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


# A temporary file written on another host is stale once untouched this long (that host's processes cannot be
# checked from here; an atomic write takes seconds).
STALE_FOREIGN_S = 3600


def remove_stale_temps(workdir: str | Path) -> list[Path]:
    """Removes the temporary files of atomic writes (`core.files.atomic_path`) that no writer will rename any more: a
    SIGKILL between writing and renaming leaves them behind. One is stale when its writer (host and pid are in its
    name) is gone from this host, or when it was written on another host and untouched for STALE_FOREIGN_S. Called
    by the run that holds the lock; returns what it removed."""
    host, now, removed = socket.gethostname(), time.time(), []
    for folder, _, names in os.walk(workdir):
        for name in names:
            m = TEMP_NAME.match(name)
            if m is None:
                continue
            p = Path(folder) / name
            try:
                if m["name_host"].endswith("." + host):
                    stale = not _pid_alive(int(m["pid"]))
                else:
                    stale = now - p.stat().st_mtime > STALE_FOREIGN_S
                if stale:
                    p.unlink()
                    removed.append(p)
            except FileNotFoundError:  # its writer renamed or removed it meanwhile
                continue
    return removed


def _locked_message(path: Path, holder: Mapping[str, Any]) -> str:
    who = f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('started')})"
    hint = ("" if holder.get("host") == socket.gethostname() else
            " That host cannot be checked from here: if that run is gone, delete the lock file.")
    if holder.get("corrupt"):
        who, hint = "an unreadable lock file", " If no run uses this workdir, delete the lock file."
    return f"{path.parent} is in use by {who}: one run per workdir (lock file {path}).{hint}"


# ------------------------------------------------------------------------------------------------
# The config check.


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out |= _flat(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]: tree}


def recordable(cfg: Config, workdir: str | Path | None = None) -> Config:
    """`cfg` as a workdir records it: without run.allow_config_change, which permits the one run that was given it
    (recorded, every later run resuming from config.yaml would be allowed any change), and with run.workdir the
    folder it is recorded in (the YAML's value is whatever the file said; the command line's --workdir wins)."""
    run = dataclasses.replace(cfg.run, allow_config_change=False)
    if workdir is not None:
        run = dataclasses.replace(run, workdir=str(workdir))
    return dataclasses.replace(cfg, run=run)


def is_unsafe(key: str) -> bool:
    """A change of `key` invalidates the workdir's checkpoints, tokenizer or latents."""
    if key.startswith("codebook."):
        return not key.startswith(CODEBOOK_SAFE + SAME_RESULTS)
    return key.startswith(UNSAFE_PREFIXES) and not key.startswith(SAFE_IN_UNSAFE)


def config_diff(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old, new)} for every value that differs (run.workdir and the allow flag excepted)."""
    a, b = _flat(to_dict(old)), _flat(to_dict(new))
    keys = sorted(set(a) | set(b))
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and not k.startswith(IGNORED)}


def holds_results(workdir: str | Path) -> bool:
    """Whether anything in `workdir` was made under its recorded config (a tokenizer, a stage's folder...):
    anything beyond config.yaml, the lock and the change log (and dotfiles, which dlr_jax does not write)."""
    own = ("config.yaml", LOCK_NAME, CHANGES_NAME, "lost+found")  # lost+found: a workdir that is a mount point
    return any(p.name not in own and not p.name.startswith(".") for p in Path(workdir).iterdir())


def check_config_change(cfg: Config, workdir: str | Path) -> dict[str, tuple[Any, Any]]:
    """Raises ConfigChangeRefused if `cfg` may not run in `workdir`; returns the (allowed) changes.
    Reads only."""
    f = Path(workdir) / "config.yaml"
    if not f.is_file():
        return {}
    try:
        recorded = load_config(f)
    except ConfigError as e:
        recorded, error = None, e
    if not holds_results(workdir):
        # a first run that stopped before writing anything (a missing checkpoint file, a refused value): the
        # recorded config binds nothing yet, so the corrected command starts over instead of being refused
        if recorded is None or config_diff(recorded, cfg):
            print(f"[dlr_jax] {workdir}: no stage has written anything yet; {f.name} will be replaced by this "
                  "run's config when its stage starts", flush=True)
        return {}
    if recorded is None:
        raise ConfigChangeRefused(f"{f}: the workdir's recorded config does not load ({error})")
    diff = config_diff(recorded, cfg)
    if not diff:
        return {}
    unsafe = {k: v for k, v in diff.items() if is_unsafe(k)}
    safe = {k: v for k, v in diff.items() if k not in unsafe}
    show = lambda d: "; ".join(f"{k}: {o!r} -> {n!r}" for k, (o, n) in d.items())  # noqa: E731
    if unsafe:
        raise ConfigChangeRefused(
            f"{workdir} was built with another model/tokenizer/data config; refusing to change "
            f"{show(unsafe)}. Its checkpoints and tokenizer belong to the recorded values ({f}): use a new "
            "--workdir."
            + (f" (Also changed, allowed with --set run.allow_config_change=true: {show(safe)}.)" if safe else "")
        )
    flagged = {k: v for k, v in safe.items()
               if not k.startswith(TRAINING_NEUTRAL + SAME_RESULTS) and not NO_RESULT.fullmatch(k)}
    if flagged and not getattr(cfg.run, "allow_config_change", False):
        raise ConfigChangeRefused(
            f"{workdir}: this run's config differs from the recorded {f}: {show(flagged)}. Rerun without the "
            "changes to resume as recorded, or pass --set run.allow_config_change=true to continue under the "
            f"new values (each change is logged to {Path(workdir) / CHANGES_NAME})."
        )
    return safe


def record_changes(workdir: str | Path, changes: Mapping[str, tuple[Any, Any]]) -> None:
    if not changes:
        return
    row = {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "changes": {k: {"old": o, "new": n} for k, (o, n) in changes.items()}}
    with open(Path(workdir) / CHANGES_NAME, "a") as fh:
        fh.write(json.dumps(row, default=str) + "\n")


class RunRefused(RuntimeError):
    """Another process of a multi-process run did not start it (its own error says why)."""


@contextlib.contextmanager
def open_run(
    cfg: Config, workdir: str | Path, *, lock: bool = True, vote: Callable[[bool], bool] | None = None
) -> Iterator[None]:
    """The lock, then the config check (nothing written if it fails), for the duration of a run.
    lock=False (processes other than 0 of a multi-process run): neither; process 0 does both.
    `vote(ok) -> all ok` (a collective every process calls once): process 0 votes whether its lock and
    check passed; the others raise `RunRefused` when it did not, instead of hanging."""
    held = WorkdirLock(workdir)
    if lock:
        existed = Path(workdir).exists()
        try:
            held.acquire()
            record_changes(workdir, check_config_change(cfg, workdir))
        except BaseException:
            held.release()
            if not existed:  # leave no empty workdir behind
                with contextlib.suppress(OSError):
                    Path(workdir).rmdir()
            if vote is not None:
                with contextlib.suppress(Exception):  # the error below is the one to report
                    vote(False)
            raise
    if vote is not None and not vote(True):
        held.release()
        raise RunRefused(f"{workdir}: process 0 did not start this run (its error says why); nothing was done here")
    if lock:
        stale = remove_stale_temps(workdir)
        if stale:
            print(f"[dlr_jax] {workdir}: removed {len(stale)} temporary file(s) that killed writes left behind "
                  f"({', '.join(str(p.relative_to(workdir)) for p in stale[:3])}{', ...' if len(stale) > 3 else ''})",
                  flush=True)
    try:
        yield
    finally:
        held.release()
