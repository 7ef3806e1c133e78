"""Qwen3-VL's vision tower out of a `qwen3_vl` checkpoint -> `models.qwen3_vl_vision.Qwen3VLVisionTower`.

The LM side of the same checkpoint is `decoder.load_hf`'s (its `model.language_model.*`, the vision
tensors ignored); this reads the other half: `config.json`'s `vision_config` and the `model.visual.*`
tensors (`visual.*` in checkpoints written before transformers 5). One table, HF name under the prefix
-> our parameter path and how the tensor is laid out:

    patch_embed.proj.weight [d, c, t, p, p]        -> patch_kernel [t, p, p, c, d]
    pos_embed.weight                                -> pos_embed
    blocks.{i}.norm{1,2}.{weight,bias}              -> blocks/ln{1,2}_{w,b}[i]
    blocks.{i}.attn.qkv.{weight [3d, d], bias}      -> blocks/{q,k,v}_{proj [d, h, hd], bias [h, hd]}[i]
    blocks.{i}.attn.proj.{weight, bias}             -> blocks/o_{proj [h, hd, d], bias}[i]
    blocks.{i}.mlp.linear_fc{1,2}.{weight, bias}    -> blocks/fc{1,2}{, _bias}[i]   (Linear: transposed)
    merger.norm / merger.linear_fc{1,2}             -> merger_ln_{w,b} / merger_fc{1,2}{, _bias}

`deepstack_merger_list.*` feed the Qwen3-VL LM's early layers, not the tower's tokens: skipped.
Every other tensor under the prefix must be used and every parameter fed (else ConversionError).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import ConfigError
from dlr_jax.convert.tensors import TensorReader, default_mesh, param_sharding, path_str, tensor_index
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.models.qwen3_vl_vision import Qwen3VLVisionConfig, Qwen3VLVisionTower, config_from_hf
from dlr_jax.models.vision import to_numpy

PREFIXES = ("model.visual.", "visual.")
SKIPPED = (re.compile(r"deepstack_merger_list\..*"), re.compile(r".*rotary_pos_emb\.inv_freq"))
def vision_config_from_hf(path: str | Path, **overrides: Any) -> Qwen3VLVisionConfig:
    """A `qwen3_vl` config.json (or its directory) -> the tower's config (`models.qwen3_vl_vision.config_from_hf`);
    `overrides` set fields afterwards (dtype, param_dtype, remat)."""
    f = Path(path)
    f = f / "config.json" if f.is_dir() else f
    try:
        raw = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConversionError(f"{f}: cannot read a config.json: {e}") from None
    if raw.get("model_type") != "qwen3_vl":
        raise ConversionError(f"{f}: model_type {raw.get('model_type')!r} has no Qwen3-VL vision tower "
                              "(expected qwen3_vl)")
    if not isinstance(raw.get("vision_config"), Mapping):
        raise ConversionError(f"{f}: no 'vision_config' section")
    try:
        return config_from_hf(raw["vision_config"], **overrides)
    except ConfigError as e:
        raise ConversionError(f"{f}: {e}") from None


def hf_arrays(cfg: Qwen3VLVisionConfig, get: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """Our parameter path -> array, from `get(HF name under the prefix)` (the module docstring's table)."""
    d, nh, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    out = {
        "patch_kernel": get("patch_embed.proj.weight").transpose(2, 3, 4, 1, 0),
        "patch_bias": get("patch_embed.proj.bias"),
        "pos_embed": get("pos_embed.weight"),
        "merger_ln_w": get("merger.norm.weight"), "merger_ln_b": get("merger.norm.bias"),
        "merger_fc1": get("merger.linear_fc1.weight").T, "merger_fc1_bias": get("merger.linear_fc1.bias"),
        "merger_fc2": get("merger.linear_fc2.weight").T, "merger_fc2_bias": get("merger.linear_fc2.bias"),
    }
    per: dict[str, list[np.ndarray]] = {}
    for i in range(cfg.depth):
        g = lambda n, i=i: get(f"blocks.{i}.{n}")  # noqa: E731
        qkv = g("attn.qkv.weight").reshape(3, nh, hd, d).transpose(0, 3, 1, 2)  # [3, d, nh, hd]
        qkv_bias = g("attn.qkv.bias").reshape(3, nh, hd)
        layer = {
            "ln1_w": g("norm1.weight"), "ln1_b": g("norm1.bias"),
            "q_proj": qkv[0], "k_proj": qkv[1], "v_proj": qkv[2],
            "q_bias": qkv_bias[0], "k_bias": qkv_bias[1], "v_bias": qkv_bias[2],
            "o_proj": g("attn.proj.weight").reshape(d, nh, hd).transpose(1, 2, 0), "o_bias": g("attn.proj.bias"),
            "ln2_w": g("norm2.weight"), "ln2_b": g("norm2.bias"),
            "fc1": g("mlp.linear_fc1.weight").T, "fc1_bias": g("mlp.linear_fc1.bias"),
            "fc2": g("mlp.linear_fc2.weight").T, "fc2_bias": g("mlp.linear_fc2.bias"),
        }
        for k, v in layer.items():
            per.setdefault(k, []).append(v)
    return out | {f"blocks/{k}": np.stack(v) for k, v in per.items()}


def vision_prefix(names: Any) -> str:
    """The prefix the checkpoint's vision tensors carry (`model.visual.` or `visual.`)."""
    for p in PREFIXES:
        if f"{p}patch_embed.proj.weight" in names:
            return p
    raise KeyError(f"no vision tower tensors (looked for {[p + 'patch_embed.proj.weight' for p in PREFIXES]})")


def fill_tower(tower: Qwen3VLVisionTower, arrays: Mapping[str, np.ndarray], place: Callable | None = None,
               where: str = "") -> None:
    """Sets every parameter of `tower` from `arrays` (our paths), in place; `place(var, host) -> array`
    puts it on devices (default: the default device)."""
    params = {path_str(p): v for p, v in nnx.to_flat_state(nnx.state(tower, nnx.Param))}
    if set(params) != set(arrays):
        raise RuntimeError(f"the name table and the tower disagree: {sorted(set(params) ^ set(arrays))}")
    for path, var in params.items():
        old = var.get_value()
        x = np.asarray(arrays[path], old.dtype)
        if tuple(x.shape) != tuple(old.shape):
            raise ConversionError(f"{where}: {path} has shape {x.shape} in the checkpoint, expected {old.shape} "
                                  "from config.json")
        var.set_value(place(var, x) if place else jax.numpy.asarray(x))


def load_state_dict(tower: Qwen3VLVisionTower, sd: Mapping[str, Any], prefix: str = "") -> None:
    """Copies transformers' `Qwen3VLVisionModel` state dict (torch tensors or arrays; keys after `prefix`)
    into `tower`, in place."""
    fill_tower(tower, hf_arrays(tower.cfg, lambda n: to_numpy(sd[prefix + n])), where="state dict")


def import_tower(tower: Qwen3VLVisionTower, hf_dir: str | Path, *, mesh: Mesh | None = None,
                 rules: str | Mapping = "fsdp") -> None:
    """Sets `tower`'s parameters from a `qwen3_vl` checkpoint directory's vision tensors, each placed on `mesh`
    (default: one device) by its logical axes. Missing, unexpected or misshapen tensors raise ConversionError."""
    hf_dir = Path(hf_dir)
    index = tensor_index(hf_dir)
    try:
        prefix = vision_prefix(index)
    except KeyError as e:
        raise ConversionError(f"{hf_dir}: {e.args[0]}") from None
    read, used = TensorReader(index), set()

    def get(name: str) -> np.ndarray:
        full = prefix + name
        if full not in index:
            raise ConversionError(f"{hf_dir}: checkpoint lacks {full!r} (vision_config: depth {tower.cfg.depth})")
        used.add(full)
        return read(full)

    arrays = hf_arrays(tower.cfg, get)
    extra = sorted(n for n in index if n.startswith(prefix) and n not in used
                   and not any(r.fullmatch(n[len(prefix):]) for r in SKIPPED))
    if extra:
        raise ConversionError(f"{hf_dir}: {len(extra)} unexpected vision tensor(s): {extra[:12]}")
    mesh = mesh or default_mesh()

    def place(var: nnx.Variable, host: np.ndarray) -> jax.Array:
        return jax.make_array_from_callback(host.shape, param_sharding(var, mesh, rules), lambda i: host[i])

    fill_tower(tower, arrays, place, str(hf_dir))


def load_qwen3_vl_vision(
    hf_dir: str | Path, *, mesh: Mesh | None = None, rules: str | Mapping = "fsdp", dtype: str | None = None,
    compute_dtype: str | None = None, remat: str = "none",
) -> tuple[Qwen3VLVisionConfig, Qwen3VLVisionTower]:
    """Imports the vision tower of a `qwen3_vl` checkpoint directory; `dtype`: the parameters',
    `compute_dtype`: the activations'. Params land on `mesh` (default: one device) by their logical axes.
    Missing, unexpected or misshapen tensors raise ConversionError."""
    overrides = {"remat": remat} | ({"param_dtype": dtype} if dtype else {}) | (
        {"dtype": compute_dtype} if compute_dtype else {})
    cfg = vision_config_from_hf(hf_dir, **overrides)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3VLVisionTower(cfg, rngs=nnx.Rngs(0))))
    tower = nnx.merge(graphdef, state)
    import_tower(tower, hf_dir, mesh=mesh, rules=rules)
    return cfg, tower
