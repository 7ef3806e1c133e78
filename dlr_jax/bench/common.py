"""What every benchmark shares: the model sizes, timing, the machine line and BENCHMARKS.md sections.

Each benchmark rewrites only the text between its `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`
markers (`write_section`) and leaves the rest of the file alone, so benchmarks run one at a time
and hand-written notes outside the markers survive.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dlr_jax.config import ModelConfig
from dlr_jax.core.machine import cpu_model

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "configs" / "tiny.yaml"  # the demo's config: what most benchmarks default to


@dataclasses.dataclass(frozen=True)
class Size:
    """Width/depth of the benchmark model (a Llama: GQA, SwiGLU, untied head, plain RoPE)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    vocab: int

    def describe(self) -> str:
        return (f"hidden {self.hidden}, {self.layers} layers, {self.heads} heads / {self.kv_heads} KV heads "
                f"(head_dim {self.hidden // self.heads}), MLP {self.mlp}, vocab {self.vocab}")

    def decode_flops(self, batch: int, context: float) -> float:
        """FLOPs of one greedy decode step for `batch` rows attending to `context` cached positions:
        2 per multiply-add of every projection, the MLP and the untied head, plus QK^T and PV."""
        hd = self.hidden // self.heads
        per_layer = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads) + 3 * self.hidden * self.mlp
        matmul = 2 * batch * (self.layers * per_layer + self.hidden * self.vocab)
        return matmul + 4 * batch * self.layers * self.heads * hd * context

    def decode_bytes(self, batch: int, cache_len: int, itemsize: int = 4) -> int:
        """Bytes one decode step must read at least: every layer weight and the untied head (not the
        embedding table: one row per token), and the K and V cache of `cache_len` slots (the sampler's
        fixed-shape cache is read whole)."""
        hd = self.hidden // self.heads
        per_layer = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads) + 3 * self.hidden * self.mlp
        weights = self.layers * per_layer + self.hidden * self.vocab
        cache = 2 * self.layers * batch * self.kv_heads * cache_len * hd
        return itemsize * (weights + cache)


# medium: the scale of a small real LM's layers (~33M params), still a few minutes on 2 CPU cores.
SIZES: dict[str, Size] = {
    "tiny": Size(hidden=32, layers=2, heads=4, kv_heads=2, mlp=64, vocab=96),  # smoke tests only
    "small": Size(hidden=256, layers=4, heads=4, kv_heads=2, mlp=768, vocab=4096),
    "medium": Size(hidden=512, layers=8, heads=8, kv_heads=4, mlp=1536, vocab=8192),
}


def model_config(size: Size, layers: int | None = None) -> ModelConfig:
    return ModelConfig(vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.mlp,
                       num_layers=layers or size.layers, num_heads=size.heads, num_kv_heads=size.kv_heads,
                       head_dim=size.hidden // size.heads, rope_theta=500000.0)


def cpu_threads() -> int:
    """Cores this process may run on; XLA's CPU thread pool is sized to them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ----------------------------------------------------------------------------------------------
# The machine a section was measured on.


def machine_info() -> dict[str, str]:
    import torch
    import transformers

    cpu = cpu_model()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    try:  # share of the last minute in which some runnable task waited for a CPU
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        load += f"; CPU pressure {float(some.split('avg60=')[1].split()[0]):.0f}% over the last minute"
    except (OSError, IndexError, ValueError):
        pass
    return {
        "cpu": cpu, "cores": f"{cpu_threads()} usable of {os.cpu_count()}", "load": load, "gpu": gpu_model(),
        "versions": f"python {platform.python_version()}, jax {jax.__version__}, flax {version('flax')}, "
                    f"torch {torch.__version__}, transformers {transformers.__version__}",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def gpu_model() -> str:
    """The GPUs `nvidia-smi` lists ("1 x NVIDIA H200, driver 580.1"), or "" where there is none. Asked
    of nvidia-smi, not JAX: initialising JAX's GPU backend here would take memory the workers need."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return ""
    if not out:
        return ""
    name, _, driver = out[0].partition(",")
    return f"{len(out)} x {name.strip()}, driver {driver.strip()}"


def version(pkg: str) -> str:
    from importlib.metadata import version as installed

    return installed(pkg)


def header(title: str, command: str, info: dict[str, str]) -> list[str]:
    """The first lines of every section: title, the command that wrote it, the machine, the date."""
    gpu = f"; GPU: {info['gpu']}" if info.get("gpu") else ""
    return [f"## {title}", "", f"Command: `{command}`  ", f"Machine: {info['cpu']}, {info['cores']} cores "
            f"(load average at start {info['load']}){gpu}; {info['versions']}  ", f"Date: {info['date']}", ""]


# ----------------------------------------------------------------------------------------------
# BENCHMARKS.md section updates.

_MARK = re.compile(r"^<!-- (/?)bench:([A-Za-z0-9_.-]+) -->\s*$")
PREAMBLE = ("# Benchmarks\n\nMeasured numbers, each section written by the command it names. Sections "
            "between `<!-- bench:NAME -->` markers are regenerated by their benchmark; edit outside them.\n")


def update_section(text: str, name: str, body: str, *, source: str = "BENCHMARKS.md") -> str:
    """Replaces the lines between `<!-- bench:name -->` and `<!-- /bench:name -->` with `body`
    (appending the marked section if absent); everything else is kept byte for byte."""
    lines = text.splitlines(keepends=True)
    start = end = None
    for i, line in enumerate(lines):
        m = _MARK.match(line)
        if not m or m.group(2) != name:
            continue
        if m.group(1) == "":
            if start is not None:
                raise ValueError(f"{source}:{i + 1}: second '<!-- bench:{name} -->' (first at line "
                                 f"{start + 1}); expected '<!-- /bench:{name} -->' before it")
            start = i
        else:
            if start is None or end is not None:
                raise ValueError(f"{source}:{i + 1}: '<!-- /bench:{name} -->' without an opening "
                                 f"'<!-- bench:{name} -->' above it")
            end = i
    if start is not None and end is None:
        raise ValueError(f"{source}:{start + 1}: '<!-- bench:{name} -->' is never closed; expected "
                         f"'<!-- /bench:{name} -->' on a later line")
    block = [f"<!-- bench:{name} -->\n", body if body.endswith("\n") else body + "\n", f"<!-- /bench:{name} -->\n"]
    if start is None:
        head = text if not text or text.endswith("\n") else text + "\n"
        return head + ("\n" if head.strip() else "") + "".join(block)
    return "".join(lines[:start] + block + lines[end + 1:])


def write_section(path: Path, name: str, body: str) -> None:
    text = path.read_text() if path.exists() else PREAMBLE
    path.write_text(update_section(text, name, body, source=str(path)))


# ----------------------------------------------------------------------------------------------
# Machine load: a ratio between two programs measured on a busy machine measures thread contention.

MAX_LOAD = 1.5  # 1-minute load average above which a benchmark writes no ratio on 2 cores (unless --allow-load)


def load_limit() -> float:
    """MAX_LOAD on the 2-core host, scaled with the usable cores elsewhere (0.75 runnable tasks per core):
    a load of 4 is a busy 2-core machine but a quiet 16-core GPU host."""
    return MAX_LOAD * max(1.0, cpu_threads() / 2)


def load_average() -> float:
    """The 1-minute load average (0.0 where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def start_load(args: Any) -> float:
    """The load average that gates a section's ratios: the CLI's reading before any section of the run
    (`args.start_load`: later readings count this run's own earlier sections), else one taken now."""
    load = getattr(args, "start_load", None)
    return load_average() if load is None else load


def ratio_refusal(loads: list[float], allow_load: bool) -> str | None:
    """Why a ratio must not be written (the highest of `loads` — load averages taken while no benchmark
    work ran, e.g. at the start — was above MAX_LOAD and --allow-load was not given), or None when it may."""
    top, limit = max(loads, default=0.0), load_limit()
    if top <= limit or allow_load:
        return None
    return (f"not written: the load average was {top:.2f} (> {limit:g} on {cpu_threads()} cores) with no benchmark "
            "work running, so the "
            "ratio would measure contention for the CPU; rerun on an idle machine, or pass --allow-load to write "
            "it anyway")


def matmul_gflops(torch_threads: Sequence[int], n: int = 1024, repeats: int = 5) -> dict[str, float]:
    """Best-of-`repeats` fp32 [n, n] @ [n, n] GFLOP/s of XLA and of PyTorch at each thread count,
    interleaved: what each side reaches on the plainest kernel, on this machine, right now."""
    import torch

    a = np.random.default_rng(0).standard_normal((n, n), np.float32)
    # the host's rate, even where a GPU is JAX's default device
    xa, ta = jax.device_put(a, jax.devices("cpu")[0]), torch.from_numpy(a.copy())
    dot = jax.jit(lambda x: x @ x)
    runs: dict[str, Callable[[], Any]] = {"xla": lambda: dot(xa).block_until_ready()}
    for th in torch_threads:
        runs[f"torch{th}"] = lambda th=th: (torch.set_num_threads(th), torch.mm(ta, ta))
    best = {}
    for name, fn in runs.items():
        fn()
        best[name] = float("inf")
    for _ in range(repeats):
        for name, fn in runs.items():
            best[name] = min(best[name], timed(fn)[0])
    return {name: 2 * n**3 / t / 1e9 for name, t in best.items()}
