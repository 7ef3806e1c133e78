"""DeepSeek-OCR-2 tensor names: the on-disk (released checkpoint / save_pretrained) naming <->
transformers' in-memory module names, and a lazy reader that serves either as the latter."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from dlr_jax.convert.tensors import TensorReader, tensor_index
from dlr_jax.models.hf_config import ConversionError

# On disk, checkpoints (the released one, and what transformers' save_pretrained writes) use the
# original DeepSeek-OCR-2 names and per-expert tensors; transformers renames them on load
# (conversion_mapping.py, "deepseek_ocr2"). (disk, in-memory) pairs after the leading "model.":
_RENAMES = (
    ("sam_model.blocks.{i}.norm1.", "vision_tower.sam_encoder.layers.{i}.layer_norm1."),
    ("sam_model.blocks.{i}.norm2.", "vision_tower.sam_encoder.layers.{i}.layer_norm2."),
    ("sam_model.blocks.{i}.attn.", "vision_tower.sam_encoder.layers.{i}.attn."),
    ("sam_model.blocks.{i}.mlp.", "vision_tower.sam_encoder.layers.{i}.mlp."),
    ("sam_model.patch_embed.proj.", "vision_tower.sam_encoder.patch_embed.projection."),
    ("sam_model.pos_embed", "vision_tower.sam_encoder.pos_embed"),
    ("sam_model.neck.0.", "vision_tower.sam_encoder.neck.conv1."),
    ("sam_model.neck.1.", "vision_tower.sam_encoder.neck.layer_norm1."),
    ("sam_model.neck.2.", "vision_tower.sam_encoder.neck.conv2."),
    ("sam_model.neck.3.", "vision_tower.sam_encoder.neck.layer_norm2."),
    ("sam_model.net_2.", "vision_tower.sam_encoder.proj.conv1."),
    ("sam_model.net_3.", "vision_tower.sam_encoder.proj.conv2."),
    ("qwen2_model.model.model.layers.", "vision_tower.vision_encoder.layers."),
    ("qwen2_model.model.model.norm.", "vision_tower.vision_encoder.norm."),
    ("qwen2_model.query_768.", "vision_tower.query_768_resolution."),
    ("qwen2_model.query_1024.", "vision_tower.query_1024_resolution."),
    ("projector.layers.", "multi_modal_projector."),
    ("view_seperator", "view_separator"),
    ("embed_tokens.", "language_model.embed_tokens."),
    ("layers.", "language_model.layers."),
    ("norm.", "language_model.norm."),
)


def _rx(literal: str) -> re.Pattern:
    return re.compile(r"^model\." + re.escape(literal).replace(r"\{i\}", r"(\d+)"))


def _tmpl(literal: str) -> str:
    return "model." + literal.replace("{i}", r"\1")


_TO_MEM = tuple((_rx(a), _tmpl(b)) for a, b in _RENAMES)
_TO_DISK = tuple((_rx(b), _tmpl(a)) for a, b in _RENAMES)
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _rename(name: str, rules: tuple[tuple[re.Pattern, str], ...]) -> str:
    for rx, tmpl in rules:
        if rx.match(name):
            return rx.sub(tmpl, name, count=1)
    return name


def to_disk_names(sd: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' in-memory names -> the on-disk (released checkpoint) names, experts split."""
    out: dict[str, np.ndarray] = {}
    for name, x in sd.items():
        disk = _rename(name, _TO_DISK)
        if disk.endswith("mlp.experts.gate_up_proj"):
            pre, f = disk.removesuffix("gate_up_proj"), x.shape[1] // 2
            for j in range(x.shape[0]):
                out[f"{pre}{j}.gate_proj.weight"], out[f"{pre}{j}.up_proj.weight"] = x[j, :f], x[j, f:]
        elif disk.endswith("mlp.experts.down_proj"):
            pre = disk.removesuffix("down_proj")
            out.update({f"{pre}{j}.down_proj.weight": x[j] for j in range(x.shape[0])})
        else:
            out[disk] = x
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


class HFTensors(Mapping):
    """Lazy read-only view of a checkpoint's tensors under transformers' in-memory names (numpy),
    from either naming; per-expert tensors are merged as transformers merges them."""

    def __init__(self, hf_dir: Path):
        self.index = tensor_index(hf_dir)
        self.read = TensorReader(self.index)
        self.used: set[str] = set()
        self.names: dict[str, list[str]] = {}  # in-memory name -> disk names
        self.merged: set[str] = set()  # names assembled from per-expert tensors
        experts: dict[str, dict[str, dict[int, str]]] = {}
        for disk in self.index:
            mem = _rename(disk, _TO_MEM)
            m = _EXPERT.match(mem)
            if m:
                experts.setdefault(m[1], {}).setdefault(m[3], {})[int(m[2])] = disk
            else:
                self.names[mem] = [disk]
        for pre, parts in experts.items():
            n = len(parts.get("down_proj", {}))

            def order(k: str, pre: str = pre, parts: dict = parts, n: int = n) -> list[str]:
                return [parts.get(k, {}).get(j, f"{pre}.{j}.{k}.weight") for j in range(n)]

            self.names[pre + ".gate_up_proj"] = order("gate_proj") + order("up_proj")
            self.names[pre + ".down_proj"] = order("down_proj")
            self.merged |= {pre + ".gate_up_proj", pre + ".down_proj"}

    def _one(self, disk: str) -> np.ndarray:
        if disk not in self.index:
            raise ConversionError(f"checkpoint lacks tensor {disk!r}")
        self.used.add(disk)
        return np.asarray(self.read(disk), np.float32)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise ConversionError(f"checkpoint lacks tensor {name!r}")
        disks = self.names[name]
        if name in self.merged and name.endswith("gate_up_proj"):  # [E, 2f, d]: gate rows then up rows per expert
            n = len(disks) // 2
            return np.stack([np.concatenate([self._one(disks[j]), self._one(disks[n + j])]) for j in range(n)])
        if name in self.merged:
            return np.stack([self._one(d) for d in disks])
        return self._one(disks[0])

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
