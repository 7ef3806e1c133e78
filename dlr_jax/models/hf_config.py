"""Hugging Face `config.json` -> `ModelConfig`: the families we read and the keys each one keeps.

Lives beside conversion (`dlr_jax.convert` re-exports it) and below it, so the config schema never
imports a CLI module. Accepts transformers-5 `rope_parameters` and the older `rope_scaling` +
`rope_theta` keys that published Llama-3.x checkpoints use.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlr_jax.config import ConfigError, ModelConfig, from_dict


class ConversionError(ValueError):
    """A checkpoint or config cannot be converted; the message names the file and tensor."""


@dataclasses.dataclass(frozen=True)
class Family:
    prefix: str  # where the decoder lives in the checkpoint
    text_key: str | None = None  # config.json sub-dict holding the LM config
    ignore: tuple[str, ...] = (r".*\.rotary_emb\.inv_freq",)  # regexes of tensors we skip
    unsupported: tuple[str, ...] = ()  # config flags that, when true, need weights we lack


FAMILIES: dict[str, Family] = {
    "llama": Family("model.", unsupported=("attention_bias", "mlp_bias")),
    "qwen2": Family("model.", unsupported=("use_sliding_window",)),
    "qwen3": Family("model.", unsupported=("attention_bias", "use_sliding_window")),
    "qwen3_vl": Family(
        "model.language_model.",
        text_key="text_config",
        ignore=(r".*\.rotary_emb\.inv_freq", r"model\.visual\..*"),
        unsupported=("attention_bias",),
    ),
}
def supported_model_types() -> str:
    return ", ".join(FAMILIES)



# ----------------------------------------------------------------------------------------------
# config.json -> ModelConfig


def _config_file(path: str | Path) -> Path:
    p = Path(path)
    return p / "config.json" if p.is_dir() or not p.suffix else p


def _read_hf_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    f = _config_file(path)
    if not f.is_file():
        raise ConversionError(
            f"{f}: not found; expected a Hugging Face config.json (supported model_type: {supported_model_types()})"
        )
    try:
        raw = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ConversionError(f"{f}:{e.lineno}: invalid JSON: {e.msg}") from None
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise ConversionError(f"{f}: model_type {model_type!r} is not supported; supported: {supported_model_types()}")
    return f, raw


def _rope_from_hf(text: Mapping[str, Any], f: Path) -> tuple[float, dict[str, Any] | None]:
    """Accepts transformers-5 `rope_parameters` and the older `rope_scaling` + `rope_theta`."""
    rp = text.get("rope_parameters")
    if rp is None:
        rp = dict(text.get("rope_scaling") or {})
    theta = float(rp.get("rope_theta", text.get("rope_theta", 10000.0)))
    kind = rp.get("rope_type", rp.get("type", "default"))
    # M-RoPE (Qwen-VL) keys only re-route position components; text-only positions are equal.
    if kind in ("default", "mrope", None):
        return theta, None
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in keys if k not in rp]
        if missing:
            raise ConversionError(f"{f}: llama3 rope scaling lacks {missing}")
        return theta, {"rope_type": "llama3", **{k: rp[k] for k in keys}}
    if kind == "linear":
        return theta, {"rope_type": "linear", "factor": rp["factor"]}
    raise ConversionError(f"{f}: rope_type {kind!r} is not supported (supported: default, llama3, linear)")


def model_config_from_hf(path: str | Path, **overrides: Any) -> ModelConfig:
    """Reads an HF `config.json` (or its directory) into a `ModelConfig`.

    `overrides` set ModelConfig fields afterwards (e.g. `param_dtype="bfloat16"`, `remat="full"`).
    Raises ConversionError for a missing file, an unknown model_type or an unsupported feature.
    """
    f, raw = _read_hf_json(path)
    model_type = raw["model_type"]
    fam = FAMILIES[model_type]
    text = raw.get(fam.text_key, None) if fam.text_key else raw
    if not isinstance(text, Mapping):
        raise ConversionError(f"{f}: model_type {model_type} needs a {fam.text_key!r} section")

    def get(key: str, default: Any = KeyError) -> Any:
        for src in (text, raw):
            if src.get(key) is not None:
                return src[key]
        if default is KeyError:
            where = f" (looked in {fam.text_key} and top level)" if fam.text_key else ""
            raise ConversionError(f"{f}: missing key {key!r}{where}")
        return default

    for flag in fam.unsupported:
        if get(flag, False):
            raise ConversionError(f"{f}: {flag}=true is not supported for model_type {model_type}")
    if get("hidden_act", "silu") != "silu":
        raise ConversionError(f"{f}: hidden_act {get('hidden_act')!r} is not supported (only silu)")
    heads = int(get("num_attention_heads"))
    hidden = int(get("hidden_size"))
    theta, scaling = _rope_from_hf(text, f)
    eos = get("eos_token_id", None)
    # Top-level tie flag wins for VL (transformers reads it from the outer config).
    tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    values: dict[str, Any] = dict(
        model_type=model_type,
        vocab_size=int(get("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(get("intermediate_size")),
        num_layers=int(get("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(get("num_key_value_heads", heads)),
        head_dim=int(get("head_dim", hidden // heads)),
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(get("max_position_embeddings", 2048)),
        tie_embeddings=bool(tie),
        attention_bias=model_type == "qwen2",
        qk_norm=model_type in ("qwen3", "qwen3_vl"),
        bos_token_id=get("bos_token_id", None),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        pad_token_id=get("pad_token_id", None),
    )
    try:
        return from_dict(ModelConfig, {**values, **overrides})
    except ConfigError as e:
        raise ConversionError(f"{f}: {e}") from None
