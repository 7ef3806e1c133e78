"""DeepSeek-OCR-2 (`model_type: deepseek_ocr2`) <-> `models.ocr2.Ocr2Model`: config, safetensors
import and export, Orbax save/load. `dlr_jax.convert.load_hf` / the `--from-hf` / `--to-hf` CLI
dispatch here for this model type.

Names follow transformers' `DeepseekOcr2ForConditionalGeneration`:
  model.vision_tower.{sam_encoder,vision_encoder}.*   -> encoder (causal_flow.load_hf_vision_state_dict)
  model.vision_tower.query_{768,1024}_resolution      -> query_small / encoder.flow.query_pool
  model.multi_modal_projector.{weight,bias}, model.view_separator
  model.language_model.*                              -> text (attention stacked over all layers,
                                                         dense MLPs / MoE over their own layers)
  lm_head.weight
Missing config keys take transformers' defaults for these classes. On-disk names: ocr2_names.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.convert.ocr2_names import HFTensors, to_disk_names
from dlr_jax.convert.tensors import default_mesh, param_sharding, path_str, restore_param_state, save_param_state
from dlr_jax.core.sharding import host_value
from dlr_jax.models.causal_flow import load_hf_vision_state_dict
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.models.moe import moe_arrays_from_hf, moe_arrays_to_hf
from dlr_jax.models.ocr2 import MODEL_TYPE, Ocr2Config, Ocr2Model, hf_config_dict, ocr2_config_from_hf
from dlr_jax.models.ocr2_text import ATTN_NAMES, DENSE_NAMES

V = "model.vision_tower."
T = "model.language_model."
# HF nn.Linear [out, in] <-> ours: attention projections split heads ([d, h, hd] / [h, hd, d]).
_ATTN_HF = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
            "q_proj": "self_attn.q_proj.weight", "k_proj": "self_attn.k_proj.weight",
            "v_proj": "self_attn.v_proj.weight", "o_proj": "self_attn.o_proj.weight"}
_DENSE_HF = {"gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight",
             "down_proj": "mlp.down_proj.weight"}


def _text_arrays(cfg: Ocr2Config, get) -> dict[str, np.ndarray]:
    """Our param path (under `text/`, plus projector etc.) -> array, from HF names."""
    b = cfg.text.base
    d, h, kv, hd = b.hidden_size, b.num_heads, b.num_kv_heads, b.head_dim
    heads = {"q_proj": h, "k_proj": kv, "v_proj": kv}
    out: dict[str, np.ndarray] = {}
    per: dict[str, list[np.ndarray]] = {n: [] for n in ATTN_NAMES + DENSE_NAMES}
    moe: list[dict[str, np.ndarray]] = []
    for i, kind in enumerate(cfg.text.mlp_layer_types):
        p = f"{T}layers.{i}."
        for n, hf in _ATTN_HF.items():
            x = get(p + hf)
            if n in heads:
                x = x.reshape(heads[n], hd, d).transpose(2, 0, 1)
            elif n == "o_proj":
                x = x.reshape(d, h, hd).transpose(1, 2, 0)
            per[n].append(x)
        if kind == "dense":
            for n, hf in _DENSE_HF.items():
                per[n].append(get(p + hf).T)
        else:
            moe.append(moe_arrays_from_hf(get, p + "mlp.", cfg.text.moe))
    for n, xs in per.items():
        if xs:  # no dense (or no sparse) layers: the empty stack keeps its zero-size init
            out[f"text/{n}"] = np.stack(xs)
    for n in moe[0] if moe else ():
        out[f"text/moe/{n}"] = np.stack([m[n] for m in moe])
    out["text/embed"] = get(T + "embed_tokens.weight")
    out["text/final_norm"] = get(T + "norm.weight")
    if not b.tie_embeddings:
        out["text/lm_head"] = get("lm_head.weight").T
    out["projector"] = get("model.multi_modal_projector.weight").T
    out["projector_bias"] = get("model.multi_modal_projector.bias")
    out["view_separator"] = get("model.view_separator")
    out["query_small"] = get(V + "query_768_resolution.weight")
    return out


def load_ocr2(
    hf_dir: str | Path, *, mesh: Mesh | None = None, rules: str | Mapping = "fsdp", dtype: str | None = None,
    compute_dtype: str | None = None, remat: str = "none",
) -> tuple[Ocr2Config, Ocr2Model]:
    """Imports a deepseek_ocr2 checkpoint directory; params land on `mesh` by their logical axes.
    Missing, unexpected or misshapen tensors raise ConversionError."""
    hf_dir = Path(hf_dir)
    raw = json.loads((hf_dir / "config.json").read_text())
    cfg = ocr2_config_from_hf(raw, dtype=dtype or "float32", compute_dtype=compute_dtype, remat=remat)
    sd = HFTensors(hf_dir)
    mesh = mesh or default_mesh()
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Ocr2Model(cfg, rngs=nnx.Rngs(0))))
    model = nnx.merge(graphdef, state)
    try:
        load_hf_vision_state_dict(model.encoder, sd, V, query_table=V + "query_1024_resolution.weight")
    except (KeyError, ValueError) as e:
        raise ConversionError(f"{hf_dir}: vision tower: {e}") from None
    arrays = _text_arrays(cfg, lambda n: sd[n])
    params = {path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    extra = sorted(set(sd.index) - sd.used)
    extra = [n for n in extra if not n.endswith("rotary_emb.inv_freq") and not (
        cfg.text.base.tie_embeddings and n == "lm_head.weight")]
    if extra:
        raise ConversionError(f"{hf_dir}: {len(extra)} unexpected tensor(s): {extra[:12]}")
    for path, var in params.items():
        old = var.get_value()
        if path in arrays:
            x = arrays[path]
            if tuple(x.shape) != tuple(old.shape):
                raise ConversionError(f"{hf_dir}: {path} has shape {x.shape} in the checkpoint, expected {old.shape}")
        elif path.startswith("encoder/") or 0 in old.shape:
            x = np.asarray(old) if path.startswith("encoder/") else np.zeros(old.shape)
        else:
            raise RuntimeError(f"no HF tensor feeds {path}")
        x = np.asarray(x, old.dtype)
        var.set_value(jax.make_array_from_callback(x.shape, param_sharding(var, mesh, rules), lambda i, h=x: h[i]))
    return cfg, model


def state_dict_from_model(model: Ocr2Model, dtype: str | None = None) -> dict[str, np.ndarray]:
    """HF-named tensors of `model` (the inverse of `load_ocr2`)."""
    cfg = model.cfg
    b = cfg.text.base
    d, h, hd = b.hidden_size, b.num_heads, b.head_dim
    cast = (lambda x: np.asarray(x, np.dtype(dtype))) if dtype else np.asarray
    g = lambda v: np.asarray(host_value(v[...]), np.float32)  # noqa: E731 - gathered when sharded over processes
    sd: dict[str, np.ndarray] = {}
    enc, vis, flow = model.encoder, model.encoder.vision, model.encoder.flow
    sd.update(_vision_to_hf(vis, flow, g))
    sd[V + "query_768_resolution.weight"] = g(model.query_small)
    sd[V + "query_1024_resolution.weight"] = g(flow.query_pool)
    del enc
    sd["model.multi_modal_projector.weight"] = g(model.projector).T
    sd["model.multi_modal_projector.bias"] = g(model.projector_bias)
    sd["model.view_separator"] = g(model.view_separator)
    t = model.text
    sd[T + "embed_tokens.weight"] = g(t.embed)
    sd[T + "norm.weight"] = g(t.final_norm)
    if not b.tie_embeddings:
        sd["lm_head.weight"] = g(t.lm_head).T
    attn = {n: g(getattr(t, n)) for n in ATTN_NAMES}
    dense = {n: g(getattr(t, n)) for n in DENSE_NAMES}
    moe = {n: g(getattr(t.moe, n)) for n in t.moe.names}
    nd = ns = 0
    for i, kind in enumerate(cfg.text.mlp_layer_types):
        p = f"{T}layers.{i}."
        for n, hf in _ATTN_HF.items():
            x = attn[n][i]
            if n in ("q_proj", "k_proj", "v_proj"):
                x = x.transpose(1, 2, 0).reshape(-1, d)
            elif n == "o_proj":
                x = x.transpose(2, 0, 1).reshape(d, h * hd)
            sd[p + hf] = x
        if kind == "dense":
            for n, hf in _DENSE_HF.items():
                sd[p + hf] = dense[n][nd].T
            nd += 1
        else:
            sd.update(moe_arrays_to_hf({n: a[ns] for n, a in moe.items()}, p + "mlp."))
            ns += 1
    return {k: np.ascontiguousarray(cast(v)) for k, v in sd.items()}


def _vision_to_hf(vis, flow, g) -> dict[str, np.ndarray]:
    """SAM + compressor + flow tensors under their transformers names (inverse of the loaders)."""
    c, fc = vis.cfg, flow.cfg
    s = V + "sam_encoder."
    conv = lambda x: x.transpose(3, 2, 0, 1)  # noqa: E731  HWIO -> OIHW
    out = {s + "patch_embed.projection.weight": conv(g(vis.patch_kernel)),
           s + "patch_embed.projection.bias": g(vis.patch_bias), s + "pos_embed": g(vis.pos_embed)[None],
           s + "neck.conv1.weight": conv(g(vis.neck_conv1)), s + "neck.conv2.weight": conv(g(vis.neck_conv2)),
           s + "proj.conv1.weight": conv(g(vis.down1)), s + "proj.conv2.weight": conv(g(vis.down2))}
    for i in (1, 2):
        out[f"{s}neck.layer_norm{i}.weight"] = g(getattr(vis, f"neck_ln{i}_w"))
        out[f"{s}neck.layer_norm{i}.bias"] = g(getattr(vis, f"neck_ln{i}_b"))
    nh, hd, d = c.num_heads, c.head_dim, c.hidden_size
    glob = sorted(c.global_attn_indexes)
    win = [i for i in range(c.num_layers) if i not in set(glob)]
    for stack, idx in ((vis.windowed, win), (vis.global_, glob)):
        a = {n: g(getattr(stack, n)) for n in stack.names}
        for j, i in enumerate(idx):
            p = f"{s}layers.{i}."
            qkv = np.stack([a["q_proj"][j], a["k_proj"][j], a["v_proj"][j]])  # [3, d, nh, hd]
            out[p + "attn.qkv.weight"] = qkv.transpose(0, 2, 3, 1).reshape(3 * d, d)
            if c.qkv_bias:
                out[p + "attn.qkv.bias"] = np.stack([a["q_bias"][j], a["k_bias"][j], a["v_bias"][j]]).reshape(-1)
            out[p + "attn.proj.weight"] = a["o_proj"][j].transpose(2, 0, 1).reshape(d, nh * hd)
            out[p + "attn.proj.bias"] = a["o_bias"][j]
            out[p + "attn.rel_pos_h"], out[p + "attn.rel_pos_w"] = a["rel_pos_h"][j], a["rel_pos_w"][j]
            for n, hf in (("ln1_w", "layer_norm1.weight"), ("ln1_b", "layer_norm1.bias"),
                          ("ln2_w", "layer_norm2.weight"), ("ln2_b", "layer_norm2.bias"),
                          ("fc1_bias", "mlp.lin1.bias"), ("fc2_bias", "mlp.lin2.bias")):
                out[p + hf] = a[n][j]
            out[p + "mlp.lin1.weight"], out[p + "mlp.lin2.weight"] = a["fc1"][j].T, a["fc2"][j].T
    e = V + "vision_encoder."
    fa = {n: np.asarray(host_value(v), np.float32) for n, v in flow.layers.arrays().items()}  # each stack once
    fd, fh, fkv, fhd = fc.hidden_size, fc.num_heads, fc.num_kv_heads, fc.head_dim
    for i in range(fc.num_layers):
        p, q = f"{e}layers.{i}.", lambda n, i=i: fa[n][i]  # noqa: E731
        out[p + "input_layernorm.weight"] = q("attn_norm")
        out[p + "post_attention_layernorm.weight"] = q("mlp_norm")
        for n, nheads in (("q", fh), ("k", fkv), ("v", fkv)):
            out[f"{p}self_attn.{n}_proj.weight"] = q(f"{n}_proj").transpose(1, 2, 0).reshape(nheads * fhd, fd)
            out[f"{p}self_attn.{n}_proj.bias"] = q(f"{n}_bias").reshape(-1)
        out[p + "self_attn.o_proj.weight"] = q("o_proj").transpose(2, 0, 1).reshape(fd, fh * fhd)
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[f"{p}mlp.{n}.weight"] = q(n).T
    out[e + "norm.weight"] = g(flow.final_norm)
    return out


def save_ocr2_hf(model: Ocr2Model, out_dir: str | Path, *, dtype: str | None = None) -> Path:
    """Writes model.safetensors + config.json that `DeepseekOcr2ForConditionalGeneration` loads."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    dtype = dtype or model.cfg.text.base.param_dtype
    sd = state_dict_from_model(model, dtype)
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        save_file(to_disk_names(sd), str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(hf_config_dict(model.cfg, dtype), indent=2))
    return out



# ----------------------------------------------------------------------------------------------
# Orbax: <dir>/params (pure dict of the Param state) + <dir>/ocr2_config.json (the HF config dict)

ORBAX_CONFIG = "ocr2_config.json"


def save_ocr2_orbax(model: Ocr2Model, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    config = hf_config_dict(model.cfg, model.cfg.text.base.param_dtype)
    return save_param_state(model, out_dir, ORBAX_CONFIG, config, overwrite=overwrite)


def load_ocr2_orbax(
    ckpt_dir: str | Path, *, mesh: Mesh | None = None, rules: str | Mapping = "fsdp"
) -> tuple[Ocr2Config, Ocr2Model]:
    d = Path(ckpt_dir).absolute()
    raw = json.loads((d / ORBAX_CONFIG).read_text())
    cfg = ocr2_config_from_hf(raw, dtype=raw.get("dtype") or "float32")
    mesh = mesh or default_mesh()
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Ocr2Model(cfg, rngs=nnx.Rngs(0))))
    restore_param_state(state, d, mesh, rules)
    return cfg, nnx.merge(graphdef, state)


def is_ocr2_dir(path: str | Path) -> bool:
    """An HF dir whose config.json has model_type deepseek_ocr2, or a save_ocr2_orbax dir."""
    p = Path(path)
    if (p / ORBAX_CONFIG).is_file():
        return True
    try:
        return json.loads((p / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, json.JSONDecodeError):
        return False
