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
        return hash(tuple(sorted((k, _freeze(v)) for k, v in self.items())))

    def _immutable(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("config mappings are immutable; use dataclasses.replace")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable  # type: ignore


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return FrozenMapping({k: _freeze(x) for k, x in v.items()})
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v
