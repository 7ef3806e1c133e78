"""One writer per workdir (the lock) and config changes refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dlr_jax.config import load_config, save_config
from dlr_jax.run.workdir import (
    CHANGES_NAME,
    LOCK_NAME,
    NO_RESULT,
    ConfigChangeRefused,
    RunRefused,
    WorkdirLock,
    WorkdirLocked,
    check_config_change,
    config_diff,
    is_unsafe,
    open_run,
)
from tests.cli_micro import ROOT, child_env, micro_yaml, run_cli


def _tree_hash(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def _record(cfg, w: Path) -> None:
    """`w` as a first run leaves it: the recorded config and something made under it (the tokenizer)."""
    save_config(cfg, w / "config.yaml")
    (w / "tokenizer").mkdir(exist_ok=True)


def test_a_first_run_that_wrote_nothing_but_its_config_does_not_bind_the_workdir(tmp_path, capsys):
    """A first run that stopped before making anything (a wrong init_from path, a refused value) left only
    config.yaml: the corrected command replaces it instead of being refused. Once anything is there, refused."""
    save_config(load_config(ROOT / "configs" / "tiny.yaml", ["init_from=/nowhere"]), tmp_path / "config.yaml")
    fixed = load_config(ROOT / "configs" / "tiny.yaml", ["model.num_layers=3"])
    assert check_config_change(fixed, tmp_path) == {}
    assert "no stage has written anything yet; config.yaml will be replaced" in capsys.readouterr().out
    (tmp_path / ".DS_Store").write_text("")  # a dotfile is not a result
    assert check_config_change(fixed, tmp_path) == {}
    (tmp_path / "tokenizer").mkdir()
    refused = r"refusing to change init_from: '/nowhere' -> None; model.num_layers: 2 -> 3.*use a new --workdir\.$"
    with pytest.raises(ConfigChangeRefused, match=refused):
        check_config_change(fixed, tmp_path)


def test_lock_is_exclusive_and_names_the_holder(tmp_path):
    a = WorkdirLock(tmp_path).acquire()
    with pytest.raises(WorkdirLocked, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
        WorkdirLock(tmp_path).acquire()
    a.release()
    assert not (tmp_path / LOCK_NAME).exists()
    WorkdirLock(tmp_path).acquire().release()


def test_stale_lock_of_a_dead_pid_on_this_host_is_taken_over(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # that process has exited
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "x"}))
    lock = WorkdirLock(tmp_path).acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert f"stale lock of pid {pid}" in capsys.readouterr().out
    lock.release()


def test_lock_from_another_host_is_refused_with_a_hint(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "other-node-7", "started": "x"}))
    with pytest.raises(WorkdirLocked, match="pid 1 on host other-node-7.*delete the lock file"):
        WorkdirLock(tmp_path).acquire()


def test_safe_and_unsafe_keys():
    assert is_unsafe("model.hidden_size") and is_unsafe("tokenizer.vocab_size") and is_unsafe("data.dataset")
    assert is_unsafe("latent.num_latents") and is_unsafe("init_from") and is_unsafe("codebook.vit_hidden")
    assert not is_unsafe("train.sft.learning_rate") and not is_unsafe("codebook.train.num_steps")
    assert not is_unsafe("data.num_workers") and not is_unsafe("mesh.fsdp") and not is_unsafe("rl.beta")
    # only sft reads the dual branch's switch and weight: the stages before it keep what they wrote
    assert not is_unsafe("latent.dual_branch") and not is_unsafe("latent.dual_branch_weight")
    assert not is_unsafe("latent.curriculum") and not is_unsafe("latent.curriculum_stages")
    # how the next stage lays out its rows; a stage stopped part way checks its own data position (pipeline)
    assert not is_unsafe("data.pack") and not is_unsafe("data.pack_batch") and is_unsafe("data.max_len")
    assert not is_unsafe("codebook.render_cache") and is_unsafe("codebook.render_view")


def test_a_workdir_from_before_codebook_pretrained_resumes_with_the_ocr2_recipe(tmp_path):
    # configs/codebook-ocr2.yaml now sets codebook.pretrained: true; a workdir it started earlier recorded false
    ocr2 = ROOT / "configs" / "codebook-ocr2.yaml"
    old = load_config(ocr2, ["codebook.init_from=/w/ocr2", "codebook.pretrained=false"])
    _record(old, tmp_path)
    now = load_config(ROOT / "configs" / "codebook-ocr2.yaml", ["codebook.init_from=/w/ocr2"])
    assert check_config_change(now, tmp_path) == {"codebook.pretrained": (False, True)}


def test_a_checked_render_cache_joins_a_workdir_without_the_flag(tmp_path):
    """README's CLI overview: a codebook stage resumed with the corpus rendered once reads the very images it would
    draw (the cache is checked against the config), so adding the cache needs no flag; the change is logged."""
    base = load_config(ROOT / "configs" / "tiny.yaml")
    _record(base, tmp_path)
    cached = load_config(ROOT / "configs" / "tiny.yaml", ["codebook.render_cache=runs/tiny_render"])
    assert check_config_change(cached, tmp_path) == {"codebook.render_cache": ("", "runs/tiny_render")}
    off = load_config(ROOT / "configs" / "tiny.yaml", ["latent.dual_branch=off"])
    with pytest.raises(ConfigChangeRefused, match="latent.dual_branch: 'auto' -> 'off'.*allow_config_change"):
        check_config_change(off, tmp_path)
    allowed = load_config(ROOT / "configs" / "tiny.yaml", ["latent.dual_branch=off", "run.allow_config_change=true"])
    assert check_config_change(allowed, tmp_path) == {"latent.dual_branch": ("auto", "off")}


def test_config_changes_need_the_flag_and_are_logged(tmp_path):
    base = load_config(ROOT / "configs" / "tiny.yaml")
    _record(base, tmp_path)
    assert check_config_change(base, tmp_path) == {}
    lr = load_config(ROOT / "configs" / "tiny.yaml", ["train.sft.learning_rate=3e-4"])
    with pytest.raises(ConfigChangeRefused, match="train.sft.learning_rate: 0.001 -> 0.0003.*allow_config_change"):
        check_config_change(lr, tmp_path)
    allowed = load_config(ROOT / "configs" / "tiny.yaml",
                          ["train.sft.learning_rate=3e-4", "run.allow_config_change=true"])
    with open_run(allowed, tmp_path):
        assert (tmp_path / LOCK_NAME).is_file()
    assert not (tmp_path / LOCK_NAME).exists()
    row = json.loads((tmp_path / CHANGES_NAME).read_text())
    assert row["changes"] == {"train.sft.learning_rate": {"old": 0.001, "new": 0.0003}}
    both = load_config(ROOT / "configs" / "tiny.yaml", ["model.num_layers=3", "run.allow_config_change=true"])
    with pytest.raises(ConfigChangeRefused, match=r"refusing to change model\.num_layers: 2 -> 3"):
        check_config_change(both, tmp_path)
    assert set(config_diff(base, both)) == {"model.num_layers"}  # the flag itself is not a change
    # the flag permits the run it was given to, not every run after it: the workdir records it off
    from dlr_jax.stages.common import prepare_workdir

    prepare_workdir(allowed, tmp_path)
    assert load_config(tmp_path / "config.yaml").run.allow_config_change is False
    with pytest.raises(ConfigChangeRefused, match="train.sft.learning_rate: 0.0003 -> 0.001"):
        check_config_change(base, tmp_path)


def test_processes_learn_that_process_0_refused_the_run(tmp_path):
    """Multi-process: only process 0 locks and checks; it votes no when that fails, and the others,
    which would otherwise wait at the first collective for a process that exited, raise RunRefused."""
    base = load_config(ROOT / "configs" / "tiny.yaml")
    _record(base, tmp_path)
    changed = load_config(ROOT / "configs" / "tiny.yaml", ["model.num_layers=3"])
    votes: list[bool] = []

    def vote(ok: bool) -> bool:  # the all-gather of two processes, process 0 having voted `votes[0]`
        votes.append(ok)
        return all(votes)

    with pytest.raises(ConfigChangeRefused), open_run(changed, tmp_path, lock=True, vote=vote):
        pass
    assert votes == [False] and not (tmp_path / LOCK_NAME).exists()
    with pytest.raises(RunRefused, match="process 0 did not start this run"), \
            open_run(changed, tmp_path, lock=False, vote=vote):
        pytest.fail("the run body must not start")
    votes.clear()
    with open_run(base, tmp_path, lock=True, vote=vote):
        assert votes == [True] and (tmp_path / LOCK_NAME).is_file()


def test_evaluation_settings_change_without_the_flag_and_are_logged(tmp_path):
    """No training stage reads eval.*: a run may resume under new evaluation settings (e.g. experiments that add
    benchmarks while seeds still train) with the change logged; anything else beside it still needs the flag."""
    base = load_config(ROOT / "configs" / "tiny.yaml")
    _record(base, tmp_path)
    ev = load_config(ROOT / "configs" / "tiny.yaml", ["eval.benchmarks=[synthetic,synthetic_hard]"])
    assert check_config_change(ev, tmp_path) == {"eval.benchmarks": (["synthetic"], ["synthetic", "synthetic_hard"])}
    with open_run(ev, tmp_path):
        pass
    assert json.loads((tmp_path / CHANGES_NAME).read_text())["changes"] == {
        "eval.benchmarks": {"old": ["synthetic"], "new": ["synthetic", "synthetic_hard"]}}
    mixed = load_config(ROOT / "configs" / "tiny.yaml", ["eval.batch_size=8", "train.sft.learning_rate=3e-4"])
    with pytest.raises(ConfigChangeRefused, match="train.sft.learning_rate") as e:
        check_config_change(mixed, tmp_path)
    assert "eval.batch_size" not in str(e.value)


def test_turning_a_progress_bar_off_on_resume_needs_no_flag(tmp_path):
    base = load_config(ROOT / "configs" / "tiny.yaml")
    _record(base, tmp_path)
    quiet = load_config(ROOT / "configs" / "tiny.yaml", ["train.sft.progress=false", "codebook.train.progress=false"])
    assert set(check_config_change(quiet, tmp_path)) == {"train.sft.progress", "codebook.train.progress"}
    with pytest.raises(ConfigChangeRefused, match="train.sft.num_steps"):
        check_config_change(load_config(ROOT / "configs" / "tiny.yaml",
                                         ["train.sft.progress=false", "train.sft.num_steps=7"]), tmp_path)
    # exactly the progress bars of the training configs: a future key that merely ends in "progress" is not exempt
    progress_keys = {k for k in config_diff(base, load_config(ROOT / "configs" / "tiny.yaml", [
        f"{k}=false" for k in ("train.textsft.progress", "train.textsft_direct.progress", "train.align.progress",
                               "train.sft.progress", "train.rl.progress", "codebook.train.progress")]))}
    assert len(progress_keys) == 6 and all(NO_RESULT.fullmatch(k) for k in progress_keys)
    assert not NO_RESULT.fullmatch("rl.curriculum.progress") and not NO_RESULT.fullmatch("model.progress")
    # the profiler window is a measurement setting too (launch/profile.sh sets it on a copy of the recorded config)
    assert NO_RESULT.fullmatch("train.rl.profile_steps") and NO_RESULT.fullmatch("codebook.train.profile_steps")
    # so is how often a stage saves and logs (a run on preemptible machines may want to save more often)
    often = load_config(ROOT / "configs" / "tiny.yaml", ["train.sft.checkpoint_every=5", "train.rl.log_every=1",
                                                         "codebook.train.keep_checkpoints=5"])
    assert set(check_config_change(often, tmp_path)) == {"train.sft.checkpoint_every", "train.rl.log_every",
                                                        "codebook.train.keep_checkpoints"}

@pytest.fixture
def used_workdir(tmp_path):
    """A workdir as a first run leaves it: config.yaml, the tokenizer, a stage checkpoint file."""
    from dlr_jax.stages import common
    cfg_file = micro_yaml(tmp_path / "micro.yaml")
    cfg = load_config(cfg_file)
    w = tmp_path / "w"
    common.prepare_workdir(cfg, w)
    common.get_tokenizer(cfg, w)
    (w / "textsft_cot" / "checkpoints" / "4").mkdir(parents=True)
    (w / "textsft_cot" / "checkpoints" / "4" / "meta").write_text("{}")
    return cfg_file, w


def test_cli_refuses_a_model_change_before_any_file_changes(used_workdir):
    cfg_file, w = used_workdir
    before = _tree_hash(w)
    out = run_cli(["--stage", "textsft", "--mode", "cot", "--config", str(cfg_file), "--workdir", str(w),
                   "--set", "model.hidden_size=64", "--set", "tokenizer.vocab_size=400",
                   "--set", "train.textsft.learning_rate=1e-3"])
    assert out.returncode == 2, out.stdout + out.stderr
    assert "model.hidden_size: 32 -> 64" in out.stderr and "tokenizer.vocab_size: 300 -> 400" in out.stderr
    assert "train.textsft.learning_rate" in out.stderr  # listed as the allowable part
    assert _tree_hash(w) == before


def test_cli_second_writer_fails_fast_naming_the_holder(used_workdir):
    cfg_file, w = used_workdir
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from dlr_jax.run.workdir import WorkdirLock; "
         f"WorkdirLock({str(w)!r}).acquire(); print('locked', flush=True); sys.stdin.read()"],
        cwd=ROOT, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _tree_hash(w)
        out = run_cli(["--stage", "textsft", "--config", str(cfg_file), "--workdir", str(w)])
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"in use by pid {holder.pid} on host {socket.gethostname()}" in out.stderr
        assert _tree_hash(w) == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_the_recorded_config_names_its_own_workdir(tmp_path):
    from dlr_jax.stages.common import prepare_workdir

    cfg = load_config(ROOT / "configs" / "tiny.yaml")  # run.workdir: the YAML's default, runs/tiny
    prepare_workdir(cfg, tmp_path / "w")
    assert load_config(tmp_path / "w" / "config.yaml").run.workdir == str(tmp_path / "w")


def test_the_run_that_takes_the_lock_removes_temporary_files_that_killed_writes_left(tmp_path, capsys):
    """A SIGKILL between an atomic write and its rename leaves `.<name>.<host>.<pid>.<random>.tmp` behind: the next run
    removes those whose writer is gone from this host, or that another host left untouched for an hour; a live
    writer's file and anything not named so stay."""
    import time

    from dlr_jax.core.files import TEMP_NAME, atomic_path
    from dlr_jax.run.workdir import STALE_FOREIGN_S

    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    w = tmp_path / "w"
    w.mkdir()
    _record(cfg, w)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, host = int(gone.stdout), socket.gethostname()
    (w / "sft" / "eval").mkdir(parents=True)
    stale = [w / f".config.yaml.{host}.{dead_pid}.0123abcd.tmp", w / "sft" / "eval" / f".results.json.{host}."
             f"{dead_pid}.89abcdef.tmp", w / ".meta.json.other-host.example.org.42.00000000.tmp"]
    kept = [w / f".config.yaml.{host}.{os.getpid()}.0123abcd.tmp",  # a live writer (this process)
            w / ".meta.json.other-host.example.org.43.00000000.tmp",  # another host's, written just now
            w / "notes.tmp", w / "sft" / "eval" / ".hidden.tmp"]  # not atomic_path's names
    for p in stale + kept:
        p.write_text("x")
    old = time.time() - STALE_FOREIGN_S - 60
    os.utime(stale[2], (old, old))
    with atomic_path(w / "probe.txt") as tmp:  # the pattern is the one atomic_path names its files by
        tmp.write_text("x")
        m = TEMP_NAME.match(tmp.name)
        assert m and m["name_host"] == f"probe.txt.{host}" and int(m["pid"]) == os.getpid()
    with open_run(cfg, w):
        pass
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept)
    assert "removed 3 temporary file(s) that killed writes left behind" in capsys.readouterr().out
