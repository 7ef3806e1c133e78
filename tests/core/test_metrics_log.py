"""metrics.jsonl keeps one row per step however often a run dies and resumes; a profile window that
cannot run is reported; launch/profile.sh with its defaults writes a trace."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from dlr_jax.core.metrics_log import ProfileWindow, drop_rows, profile_window_problem, truncate_metrics
from dlr_jax.training.trainer import Trainer
from tests.cli_micro import ROOT, child_env, micro_yaml
from tests.training.test_trainer import TCFG, dataset, lm_loss, new_model


class _DiesAt:
    """A grain iterator that raises (the process "dies") when asked for batch number `at`."""

    def __init__(self, it, at: int):
        self.it, self.at, self.i = it, at, 0

    def __next__(self):
        if self.i == self.at:
            raise RuntimeError("killed")
        self.i += 1
        return next(self.it)

    def get_state(self):
        return self.it.get_state()

    def set_state(self, state):
        self.it.set_state(state)


def _steps(path):
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def test_one_row_per_step_after_several_resumes(tmp_path, compile_cache):
    cfg = dataclasses.replace(TCFG, num_steps=7, log_every=1, checkpoint_every=2)
    # dies after steps 3 and (resumed from 2) 5: rows 3 and 5 were logged past the last checkpoint
    for at in (3, 3):
        with pytest.raises(RuntimeError, match="killed"):
            Trainer(new_model(), lm_loss, cfg, tmp_path).fit(_DiesAt(iter(dataset()), at))
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5]
    Trainer(new_model(), lm_loss, cfg, tmp_path).fit(iter(dataset()))
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6, 7]


def test_truncate_metrics_keeps_rows_up_to_the_step(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (0, 1, 2, 3, 4)))
    assert truncate_metrics(f, 2) == 2 and _steps(f) == [0, 1, 2]
    assert truncate_metrics(tmp_path / "none.jsonl", 0) == 0


def test_drop_rows_removes_only_the_evaluation_about_to_be_logged_again(tmp_path):
    """RL's checkpoint at step s comes before s's evaluation: a run killed after logging that evaluation resumes
    from s and evaluates again, so its old evaluation row goes and its training row stays."""
    f = tmp_path / "metrics.jsonl"
    rows = [{"step": 2, "reward": 0.1}, {"step": 2, "eval/reward": 0.3}, {"step": 4, "eval/reward": 0.5}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert drop_rows(f, 2, "eval/") == 1
    assert [json.loads(x) for x in f.read_text().splitlines()] == [rows[0], rows[2]]
    assert drop_rows(tmp_path / "none.jsonl", 2, "eval/") == 0


def test_profile_window_problems():
    assert profile_window_problem((10, 15), 0, 100) is None
    assert "before the resume step 12" in profile_window_problem((10, 15), 12, 100)
    assert "nothing will be traced" in profile_window_problem((100, 105), 0, 50)
    assert "stops at step 12" in profile_window_problem((10, 15), 0, 12)


def test_profile_window_traces_steps_a_plus_1_to_b(tmp_path, monkeypatch, capsys):
    import jax

    calls = []
    monkeypatch.setattr(jax.profiler, "start_trace", lambda d: calls.append(("start", d)))
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: calls.append(("stop",)))
    w = ProfileWindow("2:4", tmp_path, "rl", 0, 10)
    traced = []
    for done in range(10):  # the loop: `done` steps finished, then step done + 1 runs
        w.before(done)
        if w.tracing:
            traced.append(done + 1)
        w.after(done + 1)
    w.close()
    assert traced == [3, 4] and calls == [("start", str(tmp_path)), ("stop",)]
    assert "[rl] profile of steps 2:4" in capsys.readouterr().out
    ProfileWindow("", tmp_path, "rl", 0, 10).close()  # no window: nothing starts, nothing stops
    cut = ProfileWindow("8:12", tmp_path, "sft", 0, 10)  # past the run's end: warned, and closed by close()
    assert "stops at step 10" in capsys.readouterr().out
    for done in range(10):
        cut.before(done)
        cut.after(done + 1)
    assert cut.tracing
    cut.close()
    assert not cut.tracing and calls[-2:] == [("start", str(tmp_path)), ("stop",)]


def test_one_window_spans_a_run_fitted_in_chunks(tmp_path, monkeypatch, capsys, compile_cache):
    """The codebook's main phase is fitted in chunks (dead codes refreshed between them): the caller's window is
    traced across a chunk boundary, and no chunk warns that it starts or ends outside it."""
    import jax

    calls = []
    monkeypatch.setattr(jax.profiler, "start_trace", lambda d: calls.append(("start", jax_step(tr))))
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: calls.append(("stop", jax_step(tr))))
    jax_step = lambda t: t.step  # noqa: E731
    cfg = dataclasses.replace(TCFG, num_steps=6, checkpoint_every=10, profile_steps="1:4")
    tr = Trainer(new_model(), lm_loss, cfg, tmp_path)
    window = ProfileWindow(cfg.profile_steps, tmp_path / "profile", "codebook", 0, 6)
    data = iter(dataset())
    for end in (2, 4, 6):
        tr.fit(data, end, resume=False, bar_total=6, window=window)
    window.close()
    assert calls == [("start", 1), ("stop", 4)]  # steps 2-4 traced, over the chunk boundary at 2
    assert "warning" not in capsys.readouterr().out


def test_profile_window_before_the_resume_step_is_reported(tmp_path, capsys, compile_cache):
    cfg = dataclasses.replace(TCFG, num_steps=3, checkpoint_every=2)
    Trainer(new_model(), lm_loss, cfg, tmp_path).fit(iter(dataset()), num_steps=2)
    prof = dataclasses.replace(cfg, profile_steps="1:2")
    res = Trainer(new_model(), lm_loss, prof, tmp_path).fit(iter(dataset()))
    assert res.step == 3
    out = capsys.readouterr().out
    assert "profile_steps 1:2 starts before the resume step 2: nothing will be traced" in out
    assert not (tmp_path / "profile").exists()


@pytest.mark.slow
def test_profile_sh_with_its_defaults_writes_a_trace(tmp_path):
    """On a workdir that exists (its recorded config, CONFIG -): the stage runs in the scratch copy, which links the
    workdir's other entries; the workdir itself is not written."""
    from dlr_jax.config import load_config, save_config

    w = tmp_path / "w"
    (w / "codebook").mkdir(parents=True)  # another stage's output, which the scratch links
    save_config(load_config(micro_yaml(tmp_path / "micro.yaml")), w / "config.yaml")
    before = sorted(p.name for p in w.iterdir())
    env = child_env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # the venv's `python`
    cmd = ["bash", str(ROOT / "launch" / "profile.sh"), "textsft", "-", str(w), "--mode", "cot"]
    scratch = tmp_path / "w.profile-textsft"
    for attempt in range(2):  # a rerun profiles afresh (the previous profile's stage is replaced), not a no-op
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "profile of steps 10:15" in out.stdout and "nothing will be traced" not in out.stdout, attempt
        traces = list((scratch / "textsft_cot" / "profile").rglob("*.xplane.pb"))  # train.textsft = the CoT run
        assert len(traces) == 1 and traces[0].stat().st_size > 0
        assert _steps(scratch / "textsft_cot" / "metrics.jsonl") == list(range(1, 17))  # --steps 16 = the end + 1
    assert not (scratch / "textsft_direct").exists()  # --mode cot: one run
    assert (scratch / "codebook").is_symlink() and (scratch / "codebook").resolve() == (w / "codebook").resolve()
    assert sorted(p.name for p in w.iterdir()) == before  # nothing written into the workdir itself


def _events(path):
    """(step, SessionLog status or None, scalar tags) of every event in a TensorBoard events file (TFRecords)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out, data = [], path.read_bytes()
    while data:
        (n,) = struct.unpack("<Q", data[:8])
        e = Event.FromString(data[12:12 + n])
        data = data[16 + n:]
        status = e.session_log.status if e.HasField("session_log") else None
        out.append((e.step, status, [v.tag for v in e.summary.value]))
    return out


def test_a_resumed_run_tells_tensorboard_to_drop_the_steps_it_redoes(tmp_path):
    """A run killed after logging step 5 and resumed from its step-2 checkpoint logs 3-5 again: the new events
    file starts with TensorBoard's purge marker (a SessionLog START at step 3), so the curves show those steps
    once, as metrics.jsonl does. RL's first evaluation is step 0, redone from a start at -1."""
    from tensorboardX.proto.event_pb2 import SessionLog

    from dlr_jax.core.metrics_log import MetricsWriter

    first = MetricsWriter(tmp_path, enabled=True)
    for step in range(1, 6):
        first.write(step, {"loss": 1.0})
    first.close()
    again = MetricsWriter(tmp_path, enabled=True, resume_step=2)
    again.write(3, {"loss": 0.5})
    again.close()
    # (both writers may share one file name: tensorboardX names files by the second they were opened)
    events = [e for f in (tmp_path / "events").iterdir() for e in _events(f)]
    assert [step for step, status, _ in events if status == SessionLog.START] == [3]
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3]
    (tmp_path / "rl").mkdir()
    MetricsWriter(tmp_path / "rl", enabled=True, resume_step=-1).close()
    [rl_events] = (tmp_path / "rl" / "events").iterdir()
    assert [step for step, status, _ in _events(rl_events) if status == SessionLog.START] == [0]
