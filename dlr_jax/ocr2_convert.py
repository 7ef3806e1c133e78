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
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dlr_jax.config import ModelConfig
from dlr_jax.hf_config import ConversionError
from dlr_jax.models.causal_flow import CausalFlowConfig, EncoderConfig, load_hf_vision_state_dict
from dlr_jax.models.moe import MoeConfig, moe_arrays_from_hf, moe_arrays_to_hf
from dlr_jax.models.ocr2 import Ocr2Config, Ocr2Model
from dlr_jax.models.ocr2_text import ATTN_NAMES, DENSE_NAMES, Ocr2TextConfig
from dlr_jax.models.vision import VisionConfig
from dlr_jax.ocr2_names import _Tensors, to_disk_names  # noqa: F401 (to_disk_names re-exported)

MODEL_TYPE = "deepseek_ocr2"
V = "model.vision_tower."
T = "model.language_model."
# HF nn.Linear [out, in] <-> ours: attention projections split heads ([d, h, hd] / [h, hd, d]).
_ATTN_HF = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
            "q_proj": "self_attn.q_proj.weight", "k_proj": "self_attn.k_proj.weight",
            "v_proj": "self_attn.v_proj.weight", "o_proj": "self_attn.o_proj.weight"}
_DENSE_HF = {"gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight",
             "down_proj": "mlp.down_proj.weight"}


def _rope(d: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    rp = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = float(rp.pop("rope_theta", d.get("rope_theta", 10000.0)))
    kind = rp.get("rope_type", rp.get("type", "default"))
    return theta, (None if kind in ("default", None) else rp)


def ocr2_config_from_hf(
    raw: Mapping[str, Any], *, dtype: str = "float32", compute_dtype: str | None = None, remat: str = "none"
) -> Ocr2Config:
    """config.json dict of a deepseek_ocr2 checkpoint -> Ocr2Config; `dtype` of the parameters,
    `compute_dtype` of the activations (default: dtype), `remat` of every layer stack."""
    cd = compute_dtype or dtype
    if raw.get("model_type") != MODEL_TYPE:
        raise ConversionError(f"model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
    t = dict(raw.get("text_config") or {})
    vc = dict(raw.get("vision_config") or {})
    sam, enc = dict(vc.get("sam_config") or {}), dict(vc.get("encoder_config") or {})
    if t.get("attention_bias") or t.get("mlp_bias"):
        raise ConversionError("text_config: attention_bias / mlp_bias are not supported (DeepSeek-OCR-2 has none)")
    L, d = int(t.get("num_hidden_layers", 32)), int(t.get("hidden_size", 4096))
    h = int(t.get("num_attention_heads", 32))
    theta, scaling = _rope(t)
    base = ModelConfig(
        model_type=MODEL_TYPE, vocab_size=int(t.get("vocab_size", 102400)), hidden_size=d,
        intermediate_size=int(t.get("intermediate_size", 11008)), num_layers=L, num_heads=h,
        num_kv_heads=int(t.get("num_key_value_heads") or h), head_dim=d // h,
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(t.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), dtype=cd, param_dtype=dtype, remat=remat,
        bos_token_id=t.get("bos_token_id", 1), eos_token_id=t.get("eos_token_id", 2),
        pad_token_id=t.get("pad_token_id"),
    )
    moe = MoeConfig(
        hidden_size=d, moe_intermediate_size=int(t.get("moe_intermediate_size", 1407)),
        num_experts=int(t.get("n_routed_experts", 64)), num_experts_per_tok=int(t.get("num_experts_per_tok") or 1),
        n_shared_experts=int(t.get("n_shared_experts") or 0),
        routed_scaling_factor=float(t.get("routed_scaling_factor", 1.0)),
        topk_method=t.get("topk_method") or "greedy", n_group=t.get("n_group"), topk_group=t.get("topk_group"),
        norm_topk_prob=bool(t.get("norm_topk_prob", False)), dtype=cd, param_dtype=dtype,
    )
    types = t.get("mlp_layer_types")
    if types is None:  # DeepSeek-V2 style: first_k_dense_replace dense layers, then sparse
        k = int(t.get("first_k_dense_replace", 0))
        types = ["dense"] * k + ["sparse"] * (L - k)
    hs = int(sam.get("hidden_size", 768))
    vision = VisionConfig(
        image_size=int(sam.get("image_size", 1024)), patch_size=int(sam.get("patch_size", 16)),
        num_channels=int(sam.get("num_channels", 3)), hidden_size=hs,
        num_layers=int(sam.get("num_hidden_layers", 12)), num_heads=int(sam.get("num_attention_heads", 12)),
        mlp_dim=int(sam.get("mlp_dim") or hs * float(sam.get("mlp_ratio", 4.0))),
        global_attn_indexes=tuple(sam.get("global_attn_indexes", (2, 5, 8, 11))),
        window_size=int(sam.get("window_size", 14)), qkv_bias=bool(sam.get("qkv_bias", True)),
        layer_norm_eps=float(sam.get("layer_norm_eps", 1e-6)), neck_channels=int(sam.get("output_channels", 256)),
        compressor_channels=tuple(sam.get("downsample_channels") or (512, 896)), dtype=cd, param_dtype=dtype,
        remat=remat,
    )
    fh, fheads = int(enc.get("hidden_size", 4096)), int(enc.get("num_attention_heads", 32))
    ftheta, _ = _rope(enc)
    flow = CausalFlowConfig(
        hidden_size=fh, intermediate_size=int(enc.get("intermediate_size", 22016)),
        num_layers=int(enc.get("num_hidden_layers", 32)), num_heads=fheads,
        num_kv_heads=int(enc.get("num_key_value_heads") or fheads), head_dim=fh // fheads,
        rms_norm_eps=float(enc.get("rms_norm_eps", 1e-6)), rope_theta=ftheta, num_queries=256,
        dtype=cd, param_dtype=dtype, remat=remat,
    )
    return Ocr2Config(Ocr2TextConfig(base, moe, tuple(types)), EncoderConfig(vision, flow),
                      image_token_id=int(raw.get("image_token_id", 128815)))


def hf_config_dict(cfg: Ocr2Config, dtype: str) -> dict[str, Any]:
    """config.json that transformers reads back as the same DeepseekOcr2Config."""
    b, m, v, f = cfg.text.base, cfg.text.moe, cfg.encoder.vision, cfg.encoder.flow
    rope = {"rope_type": "default", **(b.rope_scaling or {}), "rope_theta": b.rope_theta}
    text = dict(
        model_type="deepseek_ocr2_text", vocab_size=b.vocab_size, hidden_size=b.hidden_size,
        intermediate_size=b.intermediate_size, num_hidden_layers=b.num_layers, num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads, rms_norm_eps=b.rms_norm_eps, rope_parameters=rope,
        max_position_embeddings=b.max_position_embeddings, bos_token_id=b.bos_token_id,
        eos_token_id=list(b.eos_token_id) if isinstance(b.eos_token_id, tuple) else b.eos_token_id,
        pad_token_id=b.pad_token_id, n_routed_experts=m.num_experts, num_experts_per_tok=m.num_experts_per_tok,
        n_shared_experts=m.n_shared_experts, moe_intermediate_size=m.moe_intermediate_size,
        routed_scaling_factor=m.routed_scaling_factor, topk_method=m.topk_method, n_group=m.n_group,
        topk_group=m.topk_group, mlp_layer_types=list(cfg.text.mlp_layer_types), hidden_act="silu",
    )
    sam = dict(
        model_type="deepseek_ocr2_sam_vision_model", hidden_size=v.hidden_size, output_channels=v.neck_channels,
        num_hidden_layers=v.num_layers, num_attention_heads=v.num_heads, num_channels=v.num_channels,
        image_size=v.image_size, patch_size=v.patch_size, layer_norm_eps=v.layer_norm_eps, qkv_bias=v.qkv_bias,
        window_size=v.window_size, global_attn_indexes=list(v.global_attn_indexes), mlp_dim=v.mlp_dim,
        downsample_channels=list(v.compressor_channels),
    )
    enc = dict(
        model_type="deepseek_ocr2_encoder", hidden_size=f.hidden_size, intermediate_size=f.intermediate_size,
        num_hidden_layers=f.num_layers, num_attention_heads=f.num_heads, num_key_value_heads=f.num_kv_heads,
        rms_norm_eps=f.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": f.rope_theta},
    )
    return {"architectures": ["DeepseekOcr2ForConditionalGeneration"], "model_type": MODEL_TYPE,
            "image_token_id": cfg.image_token_id, "tie_word_embeddings": b.tie_embeddings, "dtype": dtype,
            "text_config": text, "vision_config": {"sam_config": sam, "encoder_config": enc}}


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


def _path_str(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path)


def load_ocr2(
    hf_dir: str | Path, *, mesh: Mesh | None = None, rules: str | Mapping = "fsdp", dtype: str | None = None,
    compute_dtype: str | None = None, remat: str = "none",
) -> tuple[Ocr2Config, Ocr2Model]:
    """Imports a deepseek_ocr2 checkpoint directory; params land on `mesh` by their logical axes.
    Missing, unexpected or misshapen tensors raise ConversionError."""
    from dlr_jax.convert import _default_mesh, param_sharding

    hf_dir = Path(hf_dir)
    raw = json.loads((hf_dir / "config.json").read_text())
    cfg = ocr2_config_from_hf(raw, dtype=dtype or "float32", compute_dtype=compute_dtype, remat=remat)
    sd = _Tensors(hf_dir)
    mesh = mesh or _default_mesh()
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Ocr2Model(cfg, rngs=nnx.Rngs(0))))
    model = nnx.merge(graphdef, state)
    try:
        load_hf_vision_state_dict(model.encoder, sd, V, query_table=V + "query_1024_resolution.weight")
    except (KeyError, ValueError) as e:
        raise ConversionError(f"{hf_dir}: vision tower: {e}") from None
    arrays = _text_arrays(cfg, lambda n: sd[n])
    params = {_path_str(p): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
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
    g = lambda v: np.asarray(jax.device_get(v[...]), np.float32)  # noqa: E731
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
    fa = flow.layers.arrays()
    fd, fh, fkv, fhd = fc.hidden_size, fc.num_heads, fc.num_kv_heads, fc.head_dim
    for i in range(fc.num_layers):
        p, q = f"{e}layers.{i}.", lambda n, i=i: np.asarray(fa[n][i], np.float32)  # noqa: E731
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
    import orbax.checkpoint as ocp

    out = Path(out_dir).absolute()
    if (out / "params").exists() and not overwrite:
        raise ConversionError(f"{out / 'params'}: already exists (pass overwrite=True / --force)")
    out.mkdir(parents=True, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(out / "params", nnx.to_pure_dict(nnx.state(model, nnx.Param)), force=overwrite)
    ckptr.wait_until_finished()
    if jax.process_index() == 0:
        dtype = model.cfg.text.base.param_dtype
        (out / ORBAX_CONFIG).write_text(json.dumps(hf_config_dict(model.cfg, dtype), indent=2))
    return out


def load_ocr2_orbax(
    ckpt_dir: str | Path, *, mesh: Mesh | None = None, rules: str | Mapping = "fsdp"
) -> tuple[Ocr2Config, Ocr2Model]:
    import orbax.checkpoint as ocp

    from dlr_jax.convert import _default_mesh, param_sharding

    d = Path(ckpt_dir).absolute()
    raw = json.loads((d / ORBAX_CONFIG).read_text())
    cfg = ocr2_config_from_hf(raw, dtype=raw.get("dtype") or "float32")
    mesh = mesh or _default_mesh()
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Ocr2Model(cfg, rngs=nnx.Rngs(0))))

    def target(v: nnx.Variable) -> jax.ShapeDtypeStruct:
        x = v.get_value()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=param_sharding(v, mesh, rules))

    targets = nnx.to_pure_dict(jax.tree.map(target, state, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    nnx.replace_by_pure_dict(state, ocp.StandardCheckpointer().restore(d / "params", targets))
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
