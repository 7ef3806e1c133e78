"""Building the config tree from YAML files, `base:` includes and `--set key.path=value` overrides.

Strict by design: unknown keys are errors listing the valid ones, because a typo in a hyper-parameter
silently falling back to a default is the most expensive bug in research code. Override values are
parsed by the schema's type, not by YAML alone: YAML 1.1 reads `10:15` as 615 (base 60) and a bare
`1e-3` as a string, so a string field keeps the text as typed and numbers parse as numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dlr_jax.config.base import ConfigError
from dlr_jax.core.files import write_text_atomic

BASE_KEY = "base"  # a YAML file's `base: other.yaml` (or a list) is read first and deep-merged under it


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Converts a YAML/override value to the annotated type, or raises ConfigError."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, where=where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} matches none of {tp}")
    if tp is Any:
        return value
    if origin in (Mapping, dict) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if origin is tuple:
        if isinstance(value, str | int | float):
            value = [value]
        if not isinstance(value, Iterable):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (elem, *_rest) = typing.get_args(tp)
        return tuple(_coerce(v, elem, where) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected a bool, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an int, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a float, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(cls: type, data: Mapping[str, Any], *, where: str = "") -> Any:
    """Builds dataclass `cls` from `data`; unknown keys raise ConfigError listing valid keys."""
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid keys{' under ' + where if where else ''}: {', '.join(sorted(types_))}"
        )
    kwargs = {k: _coerce(v, types_[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON-serialisable)."""

    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Mapping):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, tuple | list):
            return [conv(x) for x in v]
        return v

    return conv(cfg)


def _is_text(tp: Any) -> bool:
    """str, or str | None: an override for such a field keeps its text exactly as typed."""
    if tp is str:
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args == [str]
    return False


def _parse_override(text: str, tp: Any) -> Any:
    if _is_text(tp):
        if text.strip().lower() in ("null", "none", "~") and tp is not str:
            return None
        return text
    if tp is float or tp is int:
        return text.strip()  # _coerce parses "1e-3" / "10" itself; YAML would make 1e-3 a string
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(cfg: Any, overrides: Iterable[str]) -> Any:
    """Applies `a.b=c` overrides to a (frozen) dataclass tree and returns a new tree."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        cfg = _replace_path(cfg, keys, raw, full=path)
    return cfg


def _replace_path(node: Any, keys: list[str], raw: str, *, full: str) -> Any:
    if not dataclasses.is_dataclass(node):
        raise ConfigError(f"override {full!r}: {'.'.join(keys)} is not inside a config section")
    types_ = _field_types(type(node))
    head = keys[0]
    if head not in types_:
        raise ConfigError(f"override {full!r}: unknown key {head!r}; valid keys: {', '.join(sorted(types_))}")
    if len(keys) == 1:
        new = _coerce(_parse_override(raw, types_[head]), types_[head], full)
    else:
        new = _replace_path(getattr(node, head), keys[1:], raw, full=full)
    return dataclasses.replace(node, **{head: new})


def _deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_yaml_tree(path: str | os.PathLike, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Reads a YAML config with its `base:` chain resolved (paths relative to the including file);
    later files win key by key, nested sections merge."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(f"{path}: `{BASE_KEY}:` includes form a cycle: {chain}")
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        where = f" (included from {_seen[-1]})" if _seen else ""
        raise ConfigError(f"config file not found: {path}{where}") from None
    except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, not text: one line, as any config error
        raise ConfigError(f"{path}: cannot read this config: {type(e).__name__}: {e}") from None
    except yaml.YAMLError as e:  # one line, at file:line:column (yaml's own message spans several)
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{where}: invalid YAML: {what}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    bases = data.pop(BASE_KEY, None) or []
    if isinstance(bases, str):
        bases = [bases]
    merged: dict[str, Any] = {}
    for b in bases:
        merged = _deep_merge(merged, read_yaml_tree(path.parent / b, (*_seen, path)))
    return _deep_merge(merged, data)


def load_config(path: str | os.PathLike | None = None, overrides: Iterable[str] = (), cls: type | None = None) -> Any:
    """Loads a YAML config (or defaults when `path` is None), resolving `base:` includes, then applies
    overrides."""
    if cls is None:
        from dlr_jax.config.root import Config

        cls = Config
    data = read_yaml_tree(path) if path is not None else {}
    try:
        cfg = from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path else str(e)) from None
    return apply_overrides(cfg, overrides)


def dump_config(cfg: Any) -> str:
    """The fully resolved config as YAML text (what `--print-config` prints and config.yaml holds)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: Any, path: str | os.PathLike) -> None:
    """Writes `cfg` as YAML (JSON for a .json path), atomically: other processes read config.yaml."""
    text = json.dumps(to_dict(cfg), indent=2) if str(path).endswith(".json") else dump_config(cfg)
    write_text_atomic(path, text)
