"""The config error type and the immutable mapping every config field is built from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """A configuration file or override is malformed."""


class FrozenMapping(dict):
    """An immutable, hashable dict: configs are static arguments of jitted functions (via NNX
    graph definitions), so every field must hash."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, freeze(v)) for k, v in self.items())))

    def _immutable(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("config mappings are immutable; use dataclasses.replace")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable  # type: ignore


def freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return FrozenMapping({k: freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(freeze(x) for x in v)
    return v


def auto_on_off(value: str | bool, key: str) -> str:
    """A three-way switch's value as auto | on | off (YAML's bare on/off arrive as booleans)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value not in ("auto", "on", "off"):
        raise ConfigError(f"{key} must be auto|on|off, got {value!r}")
    return value


# The dtypes a config may name (numpy / jnp spellings), with the aliases people type; a check at load time
# keeps a typo from failing deep inside a stage, after its workdir and config.yaml were written.
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16",
                 "half": "float16"}


def check_dtype(value: str, key: str, words: tuple[str, ...] = ()) -> str:
    """`value` as one of DTYPES (an alias such as bf16 spelled out) or of `words` (kept as they are), else a
    ConfigError naming `key`."""
    if value in words:
        return value
    name = DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value
    if name not in DTYPES:
        raise ConfigError(f"{key} must be one of {'|'.join(words + DTYPES)} (or {'|'.join(DTYPE_ALIASES)}), "
                          f"got {value!r}")
    return name
