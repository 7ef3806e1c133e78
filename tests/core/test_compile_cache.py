"""The persistent XLA compilation cache the entry points turn on (dlr_jax/core/compile_cache.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from dlr_jax.core import compile_cache


def test_where_the_cache_goes(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    default = str(tmp_path / "dlr_jax" / "xla")
    assert compile_cache.choose_dir("", "gpu", "") == default
    assert compile_cache.choose_dir("", "tpu", "") == default
    assert compile_cache.choose_dir("", "cpu", "") is None  # tests and CI stay hermetic
    assert compile_cache.choose_dir("/x/cache", "cpu", "") == "/x/cache"  # asked for: every backend
    assert compile_cache.choose_dir("OFF", "gpu", "") is None
    assert compile_cache.choose_dir("/x/cache", "gpu", "/jax/own") is None  # JAX's own variable wins


def test_a_second_process_loads_the_compiled_step_from_the_cache(tmp_path):
    """Two fresh processes compile the same function with DLR_COMPILE_CACHE set: the first writes an
    entry, the second finds it (JAX records a cache hit); with the cache off nothing is read."""
    script = (
        "import jax, jax.numpy as jnp\n"
        "from dlr_jax.core.compile_cache import enable\n"
        "events = []\n"
        "jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))\n"
        "print('dir', enable(log=False))\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n"
        "f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())\n"
        "print('val', float(f(jnp.ones((8, 8)))))\n"
        "print('hits', events.count('/jax/compilation_cache/cache_hits'))\n"
    )
    cache = tmp_path / "xla"
    env = {**os.environ, "DLR_COMPILE_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert f"dir {cache}" in runs[0].stdout
    assert any(cache.iterdir()), runs[0].stderr[-2000:]
    assert "hits 0" in runs[0].stdout  # compiled and wrote
    assert "hits 0" not in runs[1].stdout and "hits " in runs[1].stdout  # loaded instead of compiling
    assert runs[0].stdout.splitlines()[1] == runs[1].stdout.splitlines()[1]  # same value from the cached program
    off = subprocess.run([sys.executable, "-c", script], env={**env, "DLR_COMPILE_CACHE": "off"},
                         capture_output=True, text=True, check=True)
    assert "dir None" in off.stdout and "hits 0" in off.stdout
