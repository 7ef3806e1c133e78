"""Runs that survive storage faults: a damaged checkpoint is moved aside and the one before it resumes, a damaged
final/ is one line, a full disk is one line with exit code 75 and a resume after it is bit-exact."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from dlr_jax.core import exit_codes
from dlr_jax.run.checkpoint import CheckpointUnreadable
from dlr_jax.training.trainer import Trainer
from tests.cli_micro import MICRO, ROOT, child_env, micro_yaml
from tests.training.test_trainer import TCFG, dataset, lm_loss, new_model, params_of

CFG = dataclasses.replace(TCFG, checkpoint_every=2, keep_checkpoints=3)  # checkpoints 2, 4, 6


def _damage(step_dir: Path, how: str) -> None:
    if how == "truncated":  # an interrupted copy: every data file of the parameters cut in half
        for f in (step_dir / "params" / "ocdbt.process_0" / "d").iterdir():
            os.truncate(f, f.stat().st_size // 2)
    elif how == "missing":
        (step_dir / "params" / "manifest.ocdbt").unlink()
    else:
        raise ValueError(how)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Checkpoints 2, 4 and 6 of one run, and the steps 5-6 of a run resumed from checkpoint 4."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    old = jax.config.jax_compilation_cache_dir  # the resumed runs read the step back instead of compiling it
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla")))
    cc.reset_cache()
    src = tmp_path_factory.mktemp("run")
    Trainer(new_model(), lm_loss, CFG, src).fit(iter(dataset()))
    ref = tmp_path_factory.mktemp("ref")
    shutil.copytree(src / "checkpoints", ref / "checkpoints")
    shutil.rmtree(ref / "checkpoints" / "6")
    resumed = Trainer(new_model(), lm_loss, CFG, ref).fit(iter(dataset()))
    yield src, resumed
    jax.config.update("jax_compilation_cache_dir", old)
    cc.reset_cache()


@pytest.mark.parametrize("how", ["truncated", "missing"])
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_one_before_resumes(trained, tmp_path, capsys, how):
    src, from_4 = trained
    w = tmp_path / "w"
    shutil.copytree(src / "checkpoints", w / "checkpoints")
    _damage(w / "checkpoints" / "6", how)
    res = Trainer(new_model(), lm_loss, CFG, w).fit(iter(dataset()))
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if " is damaged " in x]
    assert line.startswith("[train] checkpoint 6 is damaged (") and f"moved to {w / 'checkpoints'}/6.damaged-" in line
    assert "[train] resumed from step 4" in out
    [aside] = (w / "checkpoints").glob("6.damaged-*")  # kept, never deleted
    assert (aside / "params").is_dir()
    assert (w / "checkpoints" / "6").is_dir()  # written again by this run
    # exactly the run resumed from checkpoint 4
    assert [h["loss"] for h in res.history] == [h["loss"] for h in from_4.history]
    for a, b in zip(jax.tree.leaves(params_of(res.model)), jax.tree.leaves(params_of(from_4.model)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_when_no_checkpoint_restores_nothing_is_moved_and_one_line_says_so(trained, tmp_path):
    src, _ = trained
    w = tmp_path / "w"
    shutil.copytree(src / "checkpoints", w / "checkpoints")
    for step in (2, 4, 6):
        _damage(w / "checkpoints" / str(step), "missing")
    with pytest.raises(CheckpointUnreadable) as e:
        Trainer(new_model(), lm_loss, CFG, w).fit(iter(dataset()))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"[train] no checkpoint in {w / 'checkpoints'} restores (step 6: ")
    assert "step 4: " in msg and "step 2: " in msg and "Nothing was moved" in msg
    assert sorted(p.name for p in (w / "checkpoints").iterdir()) == ["2", "4", "6"]


def test_cli_every_checkpoint_damaged_is_exit_2_and_one_line(tmp_path, capsys):
    from dlr_jax.train import main

    w = tmp_path / "w"
    argv = ["--stage", "textsft", "--mode", "cot", "--config", str(micro_yaml(tmp_path / "m.yaml")), "--workdir",
            str(w), "--steps", "2"]
    assert main(argv) == 0
    _damage(w / "textsft_cot" / "checkpoints" / "2", "missing")
    capsys.readouterr()
    assert main(argv) == exit_codes.REFUSED
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert line == err.strip().splitlines()[-1] and "[textsft_cot] no checkpoint in " in line and "step 2: " in line


def test_evaluate_on_a_damaged_final_is_one_line_exit_2(tmp_path, capsys):
    from dlr_jax.config import load_config
    from dlr_jax.eval import cli as ev_cli
    from tests.micro import untrained_workdir

    w = untrained_workdir(load_config(ROOT / "configs" / "tiny.yaml", MICRO), tmp_path / "w", with_codebook=False)
    params = w / "sft" / "final" / "params"
    (params / "manifest.ocdbt").unlink()
    before = sorted(p.relative_to(w) for p in w.rglob("*"))
    with pytest.raises(SystemExit) as e:
        ev_cli.cli(["--workdir", str(w), "--stage", "sft", "--limit", "2", "--no-progress"])
    assert e.value.code == exit_codes.REFUSED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {params}: does not restore ("), err
    assert "rerun the training command of the stage" in err[0]
    assert sorted(p.relative_to(w) for p in w.rglob("*")) == before  # an evaluation moves nothing


# ------------------------------------------------------------------------------------------------
# A full disk.


def test_a_full_disk_while_saving_a_checkpoint_is_exit_75_in_one_line(tmp_path, capsys, monkeypatch):
    """A patched writer (runs anywhere): the save of checkpoint 4 fails with ENOSPC; checkpoint 2 is intact and the
    next run resumes from it."""
    from dlr_jax.train import main

    real = ocp.CheckpointManager.save

    def save(self, step, *a, **k):
        if step == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(self.directory) / str(step)))
        return real(self, step, *a, **k)

    w = tmp_path / "w"
    argv = ["--stage", "textsft", "--mode", "cot", "--config", str(micro_yaml(tmp_path / "m.yaml")), "--workdir",
            str(w), "--set", "train.textsft.checkpoint_every=2"]
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    assert main(argv) == exit_codes.NO_SPACE == 75
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    ckpts = w / "textsft_cot" / "checkpoints"
    assert line.startswith(f"error: no space left on device: could not write {ckpts / '4'} (")
    assert " free there)" in line and "rerun the same command to resume (exit code 75)" in line
    assert sorted(p.name for p in ckpts.iterdir()) == ["2"] and not (w / ".lock").exists()
    monkeypatch.setattr(ocp.CheckpointManager, "save", real)
    assert main(argv) == 0
    assert "[textsft_cot] resumed from step 2" in capsys.readouterr().out


def _unshare_works(where: Path) -> str | None:
    """Why a private tmpfs cannot be mounted here (None: it can)."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux with unshare(1)"
    where.mkdir()
    probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot mount a private tmpfs (unshare -rm: {(probe.stderr or probe.stdout).strip()[:120]})"
    return None


@pytest.mark.slow
def test_a_real_full_disk_is_exit_75_and_the_resume_after_freeing_space_is_bit_exact(tmp_path):
    """A workdir on a 2 MiB tmpfs (a private mount namespace: `unshare -rm`), 1.4 MiB of it taken by another file:
    checkpoint 2 fits, checkpoint 4 does not. The run exits 75 with one line; once the other file is gone the same
    command resumes from checkpoint 2, and the stage ends with the parameters and losses of a run that never failed."""
    why = _unshare_works(tmp_path / "probe")
    if why is not None:
        pytest.skip(why)
    cfg = micro_yaml(tmp_path / "m.yaml", ["train.textsft.checkpoint_every=2", "train.textsft.keep_checkpoints=3",
                                           "train.textsft.num_steps=6"])
    train = [sys.executable, "-m", "dlr_jax.train", "--stage", "textsft", "--mode", "cot", "--config", str(cfg)]
    ref = subprocess.run([*train, "--workdir", str(tmp_path / "ref")], cwd=ROOT, env=child_env(), capture_output=True,
                         text=True, timeout=600)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    q = lambda p: "'" + str(p) + "'"  # noqa: E731
    cmd = " ".join([*(q(x) for x in train), "--workdir", q(mnt / "w")])
    script = "\n".join([
        f"mount -t tmpfs -o size=2m tmpfs {q(mnt)} || exit 99",
        f"head -c 1400k /dev/zero > {q(mnt / 'other')}",
        f"{cmd} > {q(tmp_path / 'first.log')} 2>&1; echo $? > {q(tmp_path / 'first.rc')}",
        f"ls {q(mnt / 'w' / 'textsft_cot' / 'checkpoints')} > {q(tmp_path / 'after_fault.txt')}",
        f"rm {q(mnt / 'other')}",
        f"{cmd} > {q(tmp_path / 'second.log')} 2>&1; echo $? > {q(tmp_path / 'second.rc')}",
        f"cp -a {q(mnt / 'w')} {q(out)}",
    ])
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    first = (tmp_path / "first.log").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "75", first
    assert "Traceback" not in first and "ERROR:absl" not in first, first
    [line] = [x for x in first.splitlines() if x.startswith("error:")]
    assert line == first.strip().splitlines()[-1]
    assert line.startswith(f"error: no space left on device: could not write {mnt / 'w' / 'textsft_cot'}")
    assert "free there)" in line and "rerun the same command to resume" in line
    assert "2" in (tmp_path / "after_fault.txt").read_text().split()  # the checkpoint before the fault
    second = (tmp_path / "second.log").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", second
    assert "[textsft_cot] resumed from step " in second
    rows = lambda w: [(r["step"], r["loss"]) for r in map(json.loads, (w / "textsft_cot" / "metrics.jsonl")  # noqa: E731
                                                          .read_text().splitlines())]
    assert rows(out) == rows(tmp_path / "ref")
    a, b = _final_params(out), _final_params(tmp_path / "ref")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _final_params(w: Path) -> dict[str, np.ndarray]:
    from flax import nnx

    from dlr_jax.core.sharding import make_mesh
    from dlr_jax.run.handoff import load_stage_model

    model = load_stage_model(w, "textsft_cot", mesh=make_mesh(1, 1, 1, devices=jax.devices()[:1]))[0]
    return {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
