"""Hugging Face safetensors <-> our NNX `Transformer`, and Orbax checkpoints of it.

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

CLI:
    python -m dlr_jax.convert --from-hf HF_DIR --out ORBAX_DIR [--mesh data=1,fsdp=8,tensor=1]
    python -m dlr_jax.convert --to-hf --from-orbax ORBAX_DIR --out HF_DIR [--force]
    python -m dlr_jax.convert --to-hf --from-workdir W --stage sft|rl --out HF_DIR   (dlr_jax/hf_export.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from dlr_jax.config import ConfigError, ModelConfig, from_dict, to_dict
from dlr_jax.hf_config import (  # noqa: F401 (re-exported: the public conversion API)
    FAMILIES,
    ConversionError,
    Family,
    _read_hf_json,
    _supported,
    model_config_from_hf,
)
from dlr_jax.hf_export import check_finite, export_stage, prepare_out_dir, unreadable
from dlr_jax.models.transformer import Transformer
from dlr_jax.sharding import logical_to_spec, make_mesh, parse_mesh_spec


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
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "generation_config.json", "chat_template.json", "chat_template.jinja",
                    "vocab.json", "merges.txt", "tokenizer.model")


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
# safetensors reading


def _tensor_index(hf_dir: Path) -> dict[str, Path]:
    """HF tensor name -> file, from `model.safetensors.index.json` or the *.safetensors files."""
    from safetensors import safe_open

    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ConversionError(f"{index}: no 'weight_map' object")
        return {k: hf_dir / v for k, v in weight_map.items()}
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{hf_dir}: no *.safetensors files and no model.safetensors.index.json")
    out: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as h:
                out.update({k: file for k in h.keys()})
        except Exception as e:  # safetensors raises its own error type on truncated/corrupt headers
            raise unreadable(file, e) from None
    return out


_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def read_raw(file: Path, name: str) -> np.ndarray:
    """Reads one tensor straight from the safetensors bytes (ml_dtypes covers bf16), for
    safetensors builds whose numpy backend rejects a dtype."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    with open(file, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
        if name not in header:
            raise ConversionError(f"{file}: tensor {name!r} not in file")
        meta = header[name]
        start, end = meta["data_offsets"]
        fh.seek(8 + n + start)
        buf = fh.read(end - start)
    if len(buf) != end - start:
        raise ConversionError(f"{file}: tensor {name!r} is cut short ({len(buf)} of {end - start} bytes): "
                              "truncated file")
    return np.frombuffer(buf, dtype=np.dtype(_ST_DTYPES[meta["dtype"]])).reshape(meta["shape"])


class _Reader:
    def __init__(self, index: Mapping[str, Path]):
        self.index = index
        self.handles: dict[Path, Any] = {}

    def __call__(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        file = self.index[name]
        if file not in self.handles:
            if not file.is_file():
                raise ConversionError(f"{file}: listed in the index for {name!r} but not found")
            try:
                self.handles[file] = safe_open(str(file), framework="numpy")
            except Exception as e:
                raise unreadable(file, e) from None
        try:
            x = self.handles[file].get_tensor(name)
        except (TypeError, ValueError):
            x = read_raw(file, name)
        except Exception as e:
            raise unreadable(file, e, name) from None
        check_finite(x, name, file)
        return x


# ----------------------------------------------------------------------------------------------
# HF -> ours


def _path_str(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path)


def _default_mesh() -> Mesh:
    return make_mesh(1, 1, 1, devices=[jax.devices()[0]])


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))


def param_sharding(var: nnx.Variable, mesh: Mesh, rules: str | Mapping) -> NamedSharding:
    shape = var.get_value().shape
    axes = var.get_metadata().get("logical_axes")
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def load_hf(
    hf_dir: str | Path,
    *,
    mesh: Mesh | None = None,
    rules: str | Mapping = "fsdp",
    dtype: str | None = None,
    **overrides: Any,
) -> tuple[ModelConfig, Transformer]:
    """Imports an HF checkpoint directory: `(config, model)`, `model(input_ids) -> logits [B, T, V]`.

    A `deepseek_ocr2` checkpoint gives `(Ocr2Config, Ocr2Model)` instead (dlr_jax/ocr2_convert.py;
    `overrides` do not apply), whose `model(input_ids, pixel_values=None)` is image-conditioned.

    `dtype` is the parameter dtype (default: ModelConfig.param_dtype, float32); `overrides` set other
    ModelConfig fields. Params land on `mesh` (default: one device) by their logical axes; each
    device receives only its shard. Missing, unexpected or misshapen tensors raise ConversionError.
    """
    hf_dir = Path(hf_dir)
    from dlr_jax import ocr2_convert

    if ocr2_convert.is_ocr2_dir(hf_dir):
        return ocr2_convert.load_ocr2(hf_dir, mesh=mesh, rules=rules, dtype=dtype)
    if dtype is not None:
        overrides["param_dtype"] = dtype
    cfg = model_config_from_hf(hf_dir, **overrides)
    fam = FAMILIES[cfg.model_type]
    index = _tensor_index(hf_dir)
    mesh = mesh or _default_mesh()
    graphdef, state = abstract_model(cfg)
    params = {_path_str(p): v for p, v in nnx.to_flat_state(state)}

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
    read = _Reader(index)
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
        raise ConversionError(f"model_type {cfg.model_type!r} cannot be written; supported: {_supported()}")
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


def _host(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


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
    from safetensors.numpy import save_file

    out = Path(out_dir)
    fam = FAMILIES[_hf_model_type(config)]
    dtype = dtype or config.param_dtype
    tensors: dict[str, np.ndarray] = {}
    params = {_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    for rule in DECODER_RULES:
        if rule.ours not in params:
            continue
        x = _host(params[rule.ours].get_value()).astype(np.dtype(dtype))
        check_finite(x, rule.ours, "the model to export")  # a NaN written out would load silently
        if rule.per_layer:
            tensors.update({hf_name(rule, fam, i): to_hf(rule.layout, x[i]) for i in range(x.shape[0])})
        else:
            tensors[hf_name(rule, fam)] = to_hf(rule.layout, x)
    if jax.process_index() != 0:
        return out
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in tensors.items():
        if size and size + x.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = x
        size += x.nbytes
    meta = {"format": "pt"}  # transformers refuses files without it
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / fname), metadata=meta)
            weight_map |= dict.fromkeys(shard, fname)
        total = sum(x.nbytes for x in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(hf_config_dict(config, dtype), indent=2))
    return out


# ----------------------------------------------------------------------------------------------
# Orbax: <dir>/model_config.json + <dir>/params (pure dict of the NNX Param state)


def save_orbax(
    model: Transformer, config: ModelConfig, out_dir: str | Path, *, overwrite: bool = False
) -> Path:
    """Writes `<out_dir>/params` (Orbax, the Param state as a pure dict) + `model_config.json`."""
    import orbax.checkpoint as ocp

    out = Path(out_dir).absolute()
    if (out / "params").exists() and not overwrite:
        raise ConversionError(f"{out / 'params'}: already exists (pass overwrite=True / --force)")
    out.mkdir(parents=True, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(out / "params", nnx.to_pure_dict(nnx.state(model, nnx.Param)), force=overwrite)
    ckptr.wait_until_finished()
    if jax.process_index() == 0:
        (out / "model_config.json").write_text(json.dumps(to_dict(config), indent=2))
    return out


def load_orbax(
    ckpt_dir: str | Path, mesh: Mesh | None = None, rules: str | Mapping = "fsdp"
) -> tuple[ModelConfig, Transformer]:
    """Restores a `save_orbax` directory onto shardings derived from the abstract model."""
    import orbax.checkpoint as ocp

    d = Path(ckpt_dir).absolute()
    cfg_file = d / "model_config.json"
    if not cfg_file.is_file():
        raise ConversionError(f"{cfg_file}: not found; expected a directory written by save_orbax")
    try:
        cfg = from_dict(ModelConfig, json.loads(cfg_file.read_text()))
    except (ConfigError, json.JSONDecodeError) as e:
        raise ConversionError(f"{cfg_file}: {e}") from None
    mesh = mesh or _default_mesh()
    graphdef, state = abstract_model(cfg)

    def target(v: nnx.Variable) -> jax.ShapeDtypeStruct:
        x = v.get_value()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=param_sharding(v, mesh, rules))

    targets = nnx.to_pure_dict(jax.tree.map(target, state, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    restored = ocp.StandardCheckpointer().restore(d / "params", targets)
    nnx.replace_by_pure_dict(state, restored)
    return cfg, nnx.merge(graphdef, state)


# ----------------------------------------------------------------------------------------------
# CLI


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (src / name).is_file() and jax.process_index() == 0:
            shutil.copy2(src / name, dst / name)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m dlr_jax.convert",
        description="HF safetensors <-> Orbax checkpoints of the dlr_jax Transformer "
        f"(model_type: {_supported()}, deepseek_ocr2; qwen3_vl imports the text tower, exports as qwen3).",
        epilog="examples:\n  python -m dlr_jax.convert --from-hf ~/hf/Llama-3.2-1B --out ckpt/llama1b\n"
        "  python -m dlr_jax.convert --to-hf --from-orbax ckpt/llama1b --out hf_out/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--from-hf", type=Path, metavar="DIR",
                    help="HF model dir (config.json + safetensors) to import")
    ap.add_argument("--to-hf", action="store_true", help="export --from-orbax DIR as HF safetensors")
    ap.add_argument("--from-orbax", type=Path, metavar="DIR",
                    help="directory written by --from-hf (with --to-hf)")
    ap.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    ap.add_argument("--mesh", default="data=1,fsdp=-1,tensor=1",
                    help="mesh to place params on while converting (default: all devices on fsdp)")
    ap.add_argument("--rules", default="fsdp", help="logical-axis rules profile (fsdp | tp | tpu)")
    ap.add_argument("--dtype", default=None, help="parameter dtype to store (default: float32 on import, "
                    "the checkpoint's own on export)")
    ap.add_argument("--from-workdir", type=Path, metavar="DIR",
                    help="with --to-hf: a training workdir; exports --stage's final model (latent rows included)")
    ap.add_argument("--stage", default="sft", help="with --from-workdir: sft | rl | align | textsft_cot | ...")
    ap.add_argument("--force", action="store_true",
                    help="overwrite an existing Orbax checkpoint, or (--to-hf) replace a non-empty --out")
    args = ap.parse_args(argv)
    sources = (args.from_orbax is not None) + (args.from_workdir is not None)
    if args.to_hf == (args.from_hf is not None) or (args.to_hf and sources != 1):
        ap.error("use exactly one of: --from-hf DIR   or   --to-hf --from-orbax DIR   or   --to-hf --from-workdir W")
    mesh = make_mesh(**parse_mesh_spec(args.mesh))
    from dlr_jax import ocr2_convert as o2

    try:
        source = args.from_hf if args.from_hf is not None else args.from_orbax  # None with --from-workdir
        if source is not None and o2.is_ocr2_dir(source):
            if args.from_hf is not None:
                cfg2, m2 = o2.load_ocr2(args.from_hf, mesh=mesh, rules=args.rules, dtype=args.dtype)
                out = o2.save_ocr2_orbax(m2, args.out, overwrite=args.force)
            else:
                cfg2, m2 = o2.load_ocr2_orbax(args.from_orbax, mesh=mesh, rules=args.rules)
                out = o2.save_ocr2_hf(m2, args.out, dtype=args.dtype)
            _copy_tokenizer(args.from_hf if args.from_hf is not None else args.from_orbax, out)
            print(f"wrote {out} ({o2.MODEL_TYPE}, {cfg2.text.base.num_layers} layers, "
                  f"hidden {cfg2.text.base.hidden_size})")
            return
        if args.from_hf is not None:
            cfg, model = load_hf(args.from_hf, mesh=mesh, rules=args.rules, dtype=args.dtype)
            out = save_orbax(model, cfg, args.out, overwrite=args.force)
            _copy_tokenizer(args.from_hf, out)
        elif args.from_workdir is not None:
            out = export_stage(args.from_workdir, args.stage, args.out, force=args.force, dtype=args.dtype)
            print(f"wrote {out} (stage {args.stage} of {args.from_workdir})")
            return
        else:
            cfg, model = load_orbax(args.from_orbax, mesh=mesh, rules=args.rules)
            prepare_out_dir(args.out, force=args.force)
            out = save_hf(model, cfg, args.out, dtype=args.dtype)
            _copy_tokenizer(args.from_orbax, out)
    except ConversionError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {out} ({cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size})")


if __name__ == "__main__":
    main()
