"""Hugging Face safetensors <-> our NNX `Transformer` (Llama / Qwen2 / Qwen3 / Qwen3-VL text), and
Orbax checkpoints of it.

Conversion is one declarative table (`DECODER_RULES`): each rule names an HF tensor (a template with
`{i}` for the layer index), the NNX param path it fills, and a layout saying how the two shapes
relate. HF `nn.Linear` weights are `[out, in]`; ours are `[*in, *out]` with heads split out, e.g.
`q_proj.weight [H*hd, d]` <-> `layers/q_proj [L, d, H, hd]` (layer tensors stack on a leading dim).

Supported `model_type`s: llama, qwen2, qwen3, qwen3_vl. For qwen3_vl only the text tower is
imported (`model.language_model.*` + `lm_head.weight`; `model.visual.*` is ignored). Its interleaved
M-RoPE reduces to plain RoPE for text-only input (the temporal/height/width position components are
all equal), so the text tower runs exactly as a Qwen3 decoder; image/video positions are not modelled.

Import (`load_hf`) builds the model abstractly and places each param with
`jax.make_array_from_callback`, so every device only receives its own shard. `save_hf` writes the
transformers layout; a qwen3_vl model is written as a text-only Qwen3 checkpoint (model_type
"qwen3"; `AutoModelForCausalLM` has no qwen3_vl entry and the vision tower is not ours to write).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import ConfigError, ModelConfig, from_dict, to_dict
from dlr_jax.convert import ocr2
from dlr_jax.convert.tensors import (
    TensorReader,
    check_finite,
    default_mesh,
    param_sharding,
    path_str,
    restore_param_state,
    save_param_state,
    tensor_index,
    write_safetensors,
)
from dlr_jax.core.sharding import host_value
from dlr_jax.models.hf_config import FAMILIES, ConversionError, Family, model_config_from_hf, supported_model_types
from dlr_jax.models.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class Rule:
    """`hf` (relative to the family prefix unless `absolute`) <-> `ours` (NNX state path).

    layout: "same" (identical shapes), "flat" (HF is ours flattened, e.g. biases [H*hd] <-> [H, hd]),
    "linear1"/"linear2" (HF [out, in] <-> ours [*in, *out] with the first 1 or 2 of our dims = in).
    """

    hf: str
    ours: str
    layout: str = "same"
    absolute: bool = False

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.hf


LM_HEAD = Rule("lm_head.weight", "lm_head", "linear1", absolute=True)
DECODER_RULES: tuple[Rule, ...] = (
    Rule("embed_tokens.weight", "embed"),
    Rule("norm.weight", "final_norm"),
    LM_HEAD,
    Rule("layers.{i}.input_layernorm.weight", "layers/attn_norm"),
    Rule("layers.{i}.post_attention_layernorm.weight", "layers/mlp_norm"),
    Rule("layers.{i}.self_attn.q_proj.weight", "layers/q_proj", "linear1"),
    Rule("layers.{i}.self_attn.k_proj.weight", "layers/k_proj", "linear1"),
    Rule("layers.{i}.self_attn.v_proj.weight", "layers/v_proj", "linear1"),
    Rule("layers.{i}.self_attn.o_proj.weight", "layers/o_proj", "linear2"),
    Rule("layers.{i}.self_attn.q_proj.bias", "layers/q_bias", "flat"),
    Rule("layers.{i}.self_attn.k_proj.bias", "layers/k_bias", "flat"),
    Rule("layers.{i}.self_attn.v_proj.bias", "layers/v_bias", "flat"),
    Rule("layers.{i}.self_attn.q_norm.weight", "layers/q_norm"),
    Rule("layers.{i}.self_attn.k_norm.weight", "layers/k_norm"),
    Rule("layers.{i}.mlp.gate_proj.weight", "layers/gate_proj", "linear1"),
    Rule("layers.{i}.mlp.up_proj.weight", "layers/up_proj", "linear1"),
    Rule("layers.{i}.mlp.down_proj.weight", "layers/down_proj", "linear1"),
)


_HF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

def hf_name(rule: Rule, family: Family, layer: int | None = None) -> str:
    name = rule.hf if rule.absolute else family.prefix + rule.hf
    return name.replace("{i}", str(layer)) if layer is not None else name


# ----------------------------------------------------------------------------------------------
# Layouts: per-layer shape transforms between HF and ours.


def hf_shape(layout: str, ours: Sequence[int]) -> tuple[int, ...]:
    if layout == "same":
        return tuple(ours)
    if layout == "flat":
        return (math.prod(ours),)
    n_in = int(layout.removeprefix("linear"))
    return (math.prod(ours[n_in:]), math.prod(ours[:n_in]))


def to_ours(layout: str, x: np.ndarray, ours: Sequence[int]) -> np.ndarray:
    return (x.T if layout.startswith("linear") else x).reshape(ours)


def to_hf(layout: str, x: np.ndarray) -> np.ndarray:
    shape = hf_shape(layout, x.shape)
    if layout.startswith("linear"):
        return np.ascontiguousarray(x.reshape(shape[::-1]).T)
    return x.reshape(shape)


# ----------------------------------------------------------------------------------------------
# HF -> ours


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))


def load_hf(
    hf_dir: str | Path,
    *,
    mesh: Mesh | None = None,
    rules: str | Mapping = "fsdp",
    dtype: str | None = None,
    compute_dtype: str | None = None,
    **overrides: Any,
) -> tuple[ModelConfig, Transformer]:
    """Imports an HF checkpoint directory: `(config, model)`, `model(input_ids) -> logits [B, T, V]`.

    A `deepseek_ocr2` checkpoint gives `(Ocr2Config, Ocr2Model)` instead (convert/ocr2.py;
    `overrides` do not apply), whose `model(input_ids, pixel_values=None)` is image-conditioned.

    `dtype` is the parameter dtype (default: ModelConfig.param_dtype, float32) and `compute_dtype` the
    activations' (ModelConfig.dtype; `dtype` names the parameters here, as in `convert --dtype`); `overrides`
    set other ModelConfig fields. Params land on `mesh` (default: one device) by their logical axes; each
    device receives only its shard. Missing, unexpected or misshapen tensors raise ConversionError.
    """
    hf_dir = Path(hf_dir)
    if "param_dtype" in overrides and dtype is not None:
        # Two names for one field: a caller passing a ModelConfig's fields (dtype = compute, param_dtype)
        # would otherwise store the weights in the compute dtype and compute in the weights'.
        raise TypeError(f"load_hf got both dtype={dtype!r} (the parameter dtype) and param_dtype="
                        f"{overrides['param_dtype']!r}; pass the parameter dtype as dtype= and the compute dtype "
                        "as compute_dtype=")
    if ocr2.is_ocr2_dir(hf_dir):
        return ocr2.load_ocr2(hf_dir, mesh=mesh, rules=rules, dtype=dtype, compute_dtype=compute_dtype)
    if dtype is not None:
        overrides["param_dtype"] = dtype
    if compute_dtype is not None:
        overrides["dtype"] = compute_dtype
    cfg = model_config_from_hf(hf_dir, **overrides)
    fam = FAMILIES[cfg.model_type]
    index = tensor_index(hf_dir)
    mesh = mesh or default_mesh()
    graphdef, state = abstract_model(cfg)
    params = {path_str(p): v for p, v in nnx.to_flat_state(state)}

    claimed: dict[str, list[str]] = {}  # our path -> HF names, in layer order
    for rule in DECODER_RULES:
        if rule.ours in params:
            layers = range(cfg.num_layers) if rule.per_layer else [None]
            claimed[rule.ours] = [hf_name(rule, fam, i) for i in layers]
    if set(params) - set(claimed):
        raise RuntimeError(f"DECODER_RULES has no rule for {sorted(set(params) - set(claimed))}")
    wanted = {n for names in claimed.values() for n in names}
    missing = sorted(wanted - set(index))
    if missing:
        raise ConversionError(
            f"{hf_dir}: checkpoint lacks {len(missing)} tensor(s) required by config.json "
            f"(model_type {cfg.model_type}, {cfg.num_layers} layers): {_short(missing)}; "
            f"files searched: {_short(sorted({p.name for p in index.values()}))}"
        )
    ignore = [re.compile(p) for p in fam.ignore]
    extra = sorted(n for n in set(index) - wanted if not any(r.fullmatch(n) for r in ignore))
    read = TensorReader(index)
    lm_head = hf_name(LM_HEAD, fam)
    if cfg.tie_embeddings and lm_head in extra:
        # Some tied checkpoints store the (identical) head too; a different one would be dropped.
        if not np.array_equal(read(lm_head), read(claimed["embed"][0])):
            raise ConversionError(
                f"{index[lm_head]}: tensor {lm_head!r} differs from {claimed['embed'][0]!r} although "
                "config.json sets tie_word_embeddings=true"
            )
        extra.remove(lm_head)
    if extra:
        raise ConversionError(
            f"{hf_dir}: {len(extra)} unexpected tensor(s) not used by model_type {cfg.model_type} "
            f"with {cfg.num_layers} layers: {_short(extra)}"
        )

    rule_of = {r.ours: r for r in DECODER_RULES}
    for path, var in params.items():
        shape, dt = var.get_value().shape, var.get_value().dtype
        rule = rule_of[path]
        per_layer = shape[1:] if rule.per_layer else shape
        want = hf_shape(rule.layout, per_layer)
        host = np.empty(shape, dt)  # filled layer by layer: one full copy on the host at a time
        for i, name in enumerate(claimed[path]):
            x = read(name)
            if tuple(x.shape) != want:
                raise ConversionError(
                    f"{index[name]}: tensor {name!r} has shape {tuple(x.shape)}, expected {want} "
                    f"for {path} {shape} from config.json"
                )
            host[i if rule.per_layer else ...] = to_ours(rule.layout, x, per_layer)
        # Only the callback's slice of `host` reaches each device.
        sharding = param_sharding(var, mesh, rules)
        var.set_value(jax.make_array_from_callback(shape, sharding, lambda idx, h=host: h[idx]))
        del host
    return cfg, nnx.merge(graphdef, state)


def _short(names: Sequence[str], n: int = 12) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


# ----------------------------------------------------------------------------------------------
# ours -> HF


def _hf_model_type(cfg: ModelConfig) -> str:
    mt = "qwen3" if cfg.model_type == "qwen3_vl" else cfg.model_type
    want = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True)}
    if mt not in want:
        raise ConversionError(f"model_type {cfg.model_type!r} cannot be written; supported: {supported_model_types()}")
    if (cfg.attention_bias, cfg.qk_norm) != want[mt]:
        raise ConversionError(
            f"model_type {mt} requires attention_bias={want[mt][0]}, qk_norm={want[mt][1]}; config has "
            f"{cfg.attention_bias}, {cfg.qk_norm} — set model_type to the family these weights match"
        )
    return mt


def hf_config_dict(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    mt = _hf_model_type(cfg)
    rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta}
    out: dict[str, Any] = {
        "architectures": [_HF_ARCH[mt]], "model_type": mt, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": rope, "tie_word_embeddings": cfg.tie_embeddings, "dtype": dtype,
        "bos_token_id": cfg.bos_token_id, "pad_token_id": cfg.pad_token_id,
        "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
    }
    if mt in ("llama", "qwen3"):
        out |= {"attention_bias": False} | ({"mlp_bias": False} if mt == "llama" else {})
    if mt in ("qwen2", "qwen3"):
        out["use_sliding_window"] = False
    return out


def save_hf(
    model: Transformer,
    config: ModelConfig,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Writes `model.safetensors` (sharded with an index above `max_shard_bytes`) + `config.json`
    that `transformers.AutoModelForCausalLM.from_pretrained` loads. qwen3_vl is written as qwen3."""
    import ml_dtypes  # noqa: F401

    out = Path(out_dir)
    fam = FAMILIES[_hf_model_type(config)]
    dtype = dtype or config.param_dtype
    tensors: dict[str, np.ndarray] = {}
    params = {path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    for rule in DECODER_RULES:
        if rule.ours not in params:
            continue
        x = host_value(params[rule.ours].get_value()).astype(np.dtype(dtype))
        check_finite(x, rule.ours, "the model to export")  # a NaN written out would load silently
        if rule.per_layer:
            tensors.update({hf_name(rule, fam, i): to_hf(rule.layout, x[i]) for i in range(x.shape[0])})
        else:
            tensors[hf_name(rule, fam)] = to_hf(rule.layout, x)
    if jax.process_index() != 0:
        return out
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out, tensors, max_shard_bytes)
    (out / "config.json").write_text(json.dumps(hf_config_dict(config, dtype), indent=2))
    return out


# ----------------------------------------------------------------------------------------------
# Orbax: <dir>/model_config.json + <dir>/params (pure dict of the NNX Param state)


def save_orbax(
    model: Transformer, config: ModelConfig, out_dir: str | Path, *, overwrite: bool = False
) -> Path:
    """Writes `<out_dir>/params` (Orbax, the Param state as a pure dict) + `model_config.json`."""
    return save_param_state(model, out_dir, "model_config.json", to_dict(config), overwrite=overwrite)


def load_orbax(
    ckpt_dir: str | Path, mesh: Mesh | None = None, rules: str | Mapping = "fsdp"
) -> tuple[ModelConfig, Transformer]:
    """Restores a `save_orbax` directory onto shardings derived from the abstract model."""
    d = Path(ckpt_dir).absolute()
    cfg_file = d / "model_config.json"
    if not cfg_file.is_file():
        raise ConversionError(f"{cfg_file}: not found; expected a directory written by save_orbax")
    try:
        cfg = from_dict(ModelConfig, json.loads(cfg_file.read_text()))
    except (ConfigError, json.JSONDecodeError) as e:
        raise ConversionError(f"{cfg_file}: {e}") from None
    mesh = mesh or default_mesh()
    graphdef, state = abstract_model(cfg)
    restore_param_state(state, d, mesh, rules)
    return cfg, nnx.merge(graphdef, state)


