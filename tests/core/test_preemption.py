"""Preemption: SIGTERM/SIGINT save, stop, start nothing else, exit 143/130; a rerun resumes bit-exactly."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from dlr_jax.core import preemption
from dlr_jax.run.handoff import load_stage_model
from dlr_jax.training.trainer import Trainer
from tests.cli_micro import ROOT, child_env, micro_yaml, run_cli
from tests.training.test_trainer import TCFG, dataset, lm_loss, new_model, params_of


@pytest.fixture(autouse=True)
def _clean_stop_request():
    preemption.reset()
    yield
    preemption.reset()


class _SignalAt:
    """The batches of a grain iterator (its state checkpointed as usual); signals this process while
    handing out batch number `at`."""

    def __init__(self, it, at: int, sig: int):
        self.it, self.at, self.sig, self.i = it, at, sig, 0

    def __next__(self):
        if self.i == self.at:
            os.kill(os.getpid(), self.sig)
        self.i += 1
        return next(self.it)

    def get_state(self):
        return self.it.get_state()

    def set_state(self, state):
        self.it.set_state(state)


@pytest.fixture(scope="module")
def full_params(tmp_path_factory, compile_cache):
    return params_of(Trainer(new_model(), lm_loss, TCFG, tmp_path_factory.mktemp("full")).fit(iter(dataset())).model)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_and_stops_then_resume_equals_uninterrupted(tmp_path, sig, full_params):
    cfg = dataclasses.replace(TCFG, checkpoint_every=100)  # the only checkpoint is the preemption's
    cut = Trainer(new_model(), lm_loss, cfg, tmp_path / "r").fit(_SignalAt(iter(dataset()), 2, sig))
    assert cut.preempted and cut.step == 3
    assert preemption.exit_code() == 128 + sig
    assert signal.getsignal(sig) is not preemption._handler  # handlers restored after fit
    preemption.reset()
    resumed = Trainer(new_model(), lm_loss, cfg, tmp_path / "r").fit(iter(dataset()))
    assert resumed.step == TCFG.num_steps and not resumed.preempted
    for a, b in zip(jax.tree.leaves(full_params), jax.tree.leaves(params_of(resumed.model)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_stop_requested_before_the_first_step_trains_nothing(tmp_path):
    preemption.request_stop(signal.SIGTERM)
    res = Trainer(new_model(), lm_loss, TCFG, tmp_path).fit(iter(dataset()))
    assert res.preempted and res.step == 0 and res.history == []


def _final_params(workdir, stage):
    from dlr_jax.core.sharding import make_mesh

    model = load_stage_model(workdir, stage, mesh=make_mesh(1, 1, 1, devices=jax.devices()[:1]))[0]
    return {"/".join(map(str, k)): np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.slow
def test_sigterm_in_stage_all_exits_143_starts_nothing_and_rerun_resumes(tmp_path):
    cfg = micro_yaml(tmp_path / "micro.yaml")
    w = tmp_path / "w"
    argv = ["--stage", "all", "--config", str(cfg), "--workdir", str(w)]
    cut = run_cli(argv, kill_at=("textsft_cot", 2, "SIGTERM"))
    assert cut.returncode == 143, cut.stdout + cut.stderr
    assert "exit code 143" in cut.stderr
    assert (w / "textsft_cot" / "checkpoints" / "2").is_dir()
    for later in ("textsft_cot/final", "textsft_direct", "align", "sft", "rl"):
        assert not (w / later).exists(), f"{later} started after SIGTERM"

    # The rerun resumes CoT-SFT at step 2, runs Direct-SFT, and is preempted again in align (which keeps
    # this test cheap: sft and rl would only repeat what the first cut shows).
    again = run_cli(argv, kill_at=("align", 1, "SIGTERM"))
    assert again.returncode == 143, again.stdout + again.stderr
    assert "[textsft_cot] resumed from step 2" in again.stdout
    for stage in ("textsft_cot", "textsft_direct"):
        assert (w / stage / "final" / "meta.json").is_file(), stage
    assert (w / "align" / "checkpoints" / "1").is_dir() and not (w / "align" / "final").exists()
    assert not (w / "sft").exists()

    ref = tmp_path / "ref"  # the same CoT-SFT run, never interrupted
    one = run_cli(["--stage", "textsft", "--mode", "cot", "--config", str(cfg), "--workdir", str(ref)])
    assert one.returncode == 0, one.stdout + one.stderr
    a, b = _final_params(w, "textsft_cot"), _final_params(ref, "textsft_cot")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.slow
def test_sigint_in_textsft_both_exits_130_without_direct_sft(tmp_path):
    cfg = micro_yaml(tmp_path / "micro.yaml")
    w = tmp_path / "w"
    out = run_cli(["--stage", "textsft", "--config", str(cfg), "--workdir", str(w)],
                  kill_at=("textsft_cot", 1, "SIGINT"))
    assert out.returncode == 130, out.stdout + out.stderr
    assert (w / "textsft_cot" / "checkpoints" / "1").is_dir()
    assert not (w / "textsft_direct").exists()


_AGREE = """
import json, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
from dlr_jax.core import preemption
if jax.process_index() == 1:
    preemption.request_stop()  # only process 1 got the signal
alone = preemption.should_stop(sync=False)  # not a sync step: nobody stops alone
agreed = preemption.should_stop(sync=True)
print(json.dumps({"alone": alone, "agreed": agreed, "code": preemption.exit_code()}), flush=True)
"""


@pytest.mark.slow
def test_processes_agree_on_the_stop():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", _AGREE, f"127.0.0.1:{port}", str(i)], cwd=ROOT,
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"alone": False, "agreed": True, "code": 143}
