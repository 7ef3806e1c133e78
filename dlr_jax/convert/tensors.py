"""Reading safetensors checkpoints and placing what they hold: what the decoder and the OCR-2
converters share. Every failure is a `ConversionError` naming the file (and tensor)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from dlr_jax.core.sharding import logical_to_spec, make_mesh
from dlr_jax.models.hf_config import ConversionError
from dlr_jax.run.checkpoint import configure_orbax


def check_finite(x: np.ndarray, name: str, where: str | Path) -> None:
    if x.dtype.kind == "f" or str(x.dtype) == "bfloat16":
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(np.asarray(x, np.float32))))
        if bad:
            raise ConversionError(f"{where}: tensor {name!r} has {bad} non-finite value(s) (NaN/Inf)")


def unreadable(file: str | Path, e: Exception, name: str | None = None) -> ConversionError:
    """One line for a safetensors file (or tensor) that cannot be read: usually a truncated copy."""
    what = f"tensor {name!r} cannot be read" if name else "not a readable safetensors file"
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return ConversionError(f"{file}: {what} (truncated or corrupt?): {first}")


def tensor_index(hf_dir: Path) -> dict[str, Path]:
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


class TensorReader:
    """name -> numpy array from the files of a `tensor_index`, each opened once; non-finite values raise."""

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


def write_safetensors(out: Path, tensors: Mapping[str, np.ndarray], max_shard_bytes: int = 4 << 30) -> None:
    """`out/model.safetensors`, or shards `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`
    above `max_shard_bytes`, in the layout `transformers.from_pretrained` reads."""
    from safetensors.numpy import save_file

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
        return
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata=meta)
        weight_map |= dict.fromkeys(shard, fname)
    index = {"metadata": {"total_size": sum(x.nbytes for x in tensors.values())}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def path_str(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path)


def default_mesh() -> Mesh:
    return make_mesh(1, 1, 1, devices=[jax.local_devices()[0]])


def param_sharding(var: nnx.Variable, mesh: Mesh, rules: str | Mapping) -> NamedSharding:
    shape = var.get_value().shape
    axes = var.get_metadata().get("logical_axes")
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


# ----------------------------------------------------------------------------------------------
# Orbax: <dir>/params (the Param state as a pure dict) + one JSON file that says what model it is.


def save_param_state(model: nnx.Module, out_dir: str | Path, config_file: str, config: Mapping[str, Any], *,
                     overwrite: bool = False) -> Path:
    """Writes `<out_dir>/params` and `<out_dir>/<config_file>` (process 0); refuses to replace an
    existing checkpoint unless `overwrite`."""
    import orbax.checkpoint as ocp

    out = Path(out_dir).absolute()
    if (out / "params").exists() and not overwrite:
        raise ConversionError(f"{out / 'params'}: already exists (pass overwrite=True / --force)")
    out.mkdir(parents=True, exist_ok=True)
    configure_orbax()
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(out / "params", nnx.to_pure_dict(nnx.state(model, nnx.Param)), force=overwrite)
    ckptr.wait_until_finished()
    if jax.process_index() == 0:
        (out / config_file).write_text(json.dumps(dict(config), indent=2))
    return out


def restore_param_state(state: nnx.State, ckpt_dir: str | Path, mesh: Mesh, rules: str | Mapping) -> None:
    """Fills the abstract `state` from `<ckpt_dir>/params`, each param restored straight onto its
    sharding on `mesh` (from its logical axes)."""
    import orbax.checkpoint as ocp

    def target(v: nnx.Variable) -> jax.ShapeDtypeStruct:
        x = v.get_value()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=param_sharding(v, mesh, rules))

    targets = nnx.to_pure_dict(jax.tree.map(target, state, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    nnx.replace_by_pure_dict(state, ocp.StandardCheckpointer().restore(Path(ckpt_dir).absolute() / "params", targets))
