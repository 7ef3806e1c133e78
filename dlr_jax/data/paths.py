"""Where benchmark files live.

Lookup order for the data root:
1. `$DLR_DATA_DIR` when set (it must exist: a typo should not fall through to another copy);
2. `<repo>/../shared/data` (the layout of this workplace);
3. `<repo>/data` (where `python -m dlr_jax.data.download all --to data` writes by default).

Below the root each dataset has its own folder:
`gsm8k/ gsm8k_aug/ gsm_hard/ svamp/ multiarith/ math500/ math_train/`.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "DLR_DATA_DIR"


def repo_root() -> Path:
    """The checkout holding the `dlr_jax` package (dlr_jax/data/paths.py -> parents[2])."""
    return Path(__file__).resolve().parents[2]


def candidate_data_dirs() -> list[Path]:
    """The data roots tried in order (see the module docstring)."""
    out = []
    env = os.environ.get(ENV_VAR)
    if env:
        out.append(Path(env).expanduser())
    root = repo_root()
    out.append((root / ".." / "shared" / "data").resolve())
    out.append(root / "data")
    return out


def shared_data_dir() -> Path:
    """The first existing data root; FileNotFoundError listing what was tried otherwise."""
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(f"${ENV_VAR}={env!r} is not a directory")
        return p
    tried = candidate_data_dirs()
    for p in tried:
        if p.is_dir():
            return p
    raise FileNotFoundError(
        "no benchmark data directory found; tried "
        + ", ".join(str(p) for p in tried)
        + f". Set ${ENV_VAR} or run `python -m dlr_jax.data.download all --to data`."
    )


def dataset_dir(subdir: str) -> Path:
    """`shared_data_dir() / subdir` (not checked for existence; readers report missing files)."""
    return shared_data_dir() / subdir
