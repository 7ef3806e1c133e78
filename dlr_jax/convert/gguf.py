"""GGUF (llama.cpp's file format) -> a Hugging Face checkpoint folder that `load_hf` and `init_from` read.

    python -m dlr_jax.convert --from-gguf FILE.gguf --out HF_DIR [--dtype float32|bfloat16] [--force]

The folder holds config.json, model.safetensors (sharded with an index when large), tokenizer.json +
tokenizer_config.json (+ chat_template.jinja when the file has a chat template): what a user downloads from
the hub, so every stage and `--to-hf` treat it like any other checkpoint. Quantized tensors (Q4_1, Q8_0, ...)
are dequantized; config.json's `dlr_jax_gguf` records the file (name, sha256), its quantization (llama.cpp's
file type and the count of tensors per type) and the dtype written, since a dequantized Q4 model is not the
model its authors trained in bf16 and a result reported on it should say so.

Families: the GGUF architectures llama, qwen2, qwen3 (our model_types of the same names). llama.cpp's
converter reorders the rows of a Llama q/k projection for its interleaved RoPE; `unpermute_qk` puts them back in
the half-split order of transformers (and ours); qwen2/qwen3 GGUFs keep the HF order.

Why two readers: the weights go through our own table (`GGUF_RULES`) and gguf-py's numpy dequantizer, not
through transformers' GGUF loader, so that (1) a test can hold our conversion against transformers' as an
independent implementation (a q/k permutation or a name swap would show there, and the same reader on both
sides would prove nothing), (2) tensors are read one at a time from the memory-mapped file and never pass
through a torch module, and (3) the mapping is a declarative table like the safetensors one
(CONTRIBUTING.md, "HF interop"). The tokenizer comes from transformers' GGUF tokenizer rebuild (vocabulary, merges,
the pre-tokenizer regex named by `tokenizer.ggml.pre`, special tokens, chat template): rebuilding a
pre-tokenizer by hand is where a conversion goes wrong silently (a different split of digits is a
different model), and transformers is the reference the hub's own tokenizer.json files come from. That
path imports torch, so `--from-gguf` needs `pip install gguf torch` (the test extra has both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.config import ConfigError, ModelConfig, from_dict
from dlr_jax.models.hf_config import ConversionError

FORMAT_KEY = "dlr_jax_gguf"  # config.json's record of the source file
ARCHITECTURES = ("llama", "qwen2", "qwen3")  # GGUF `general.architecture` -> our model_type (the same name)
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class GgufRule:
    """GGUF tensor `gguf` <-> HF tensor `hf` (`{i}`: the layer). `unpermute`: "q" / "k" for a Llama projection
    whose rows llama.cpp reordered; `optional`: a tensor only some families have (biases, q/k norms)."""

    gguf: str
    hf: str
    unpermute: str | None = None
    optional: bool = False


GGUF_RULES: tuple[GgufRule, ...] = (
    GgufRule("token_embd.weight", "model.embed_tokens.weight"),
    GgufRule("output_norm.weight", "model.norm.weight"),
    GgufRule("output.weight", "lm_head.weight", optional=True),  # absent: tied embeddings
    GgufRule("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    GgufRule("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    GgufRule("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight", unpermute="q"),
    GgufRule("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight", unpermute="k"),
    GgufRule("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    GgufRule("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    GgufRule("blk.{i}.attn_q.bias", "model.layers.{i}.self_attn.q_proj.bias", optional=True),
    GgufRule("blk.{i}.attn_k.bias", "model.layers.{i}.self_attn.k_proj.bias", optional=True),
    GgufRule("blk.{i}.attn_v.bias", "model.layers.{i}.self_attn.v_proj.bias", optional=True),
    GgufRule("blk.{i}.attn_q_norm.weight", "model.layers.{i}.self_attn.q_norm.weight", optional=True),
    GgufRule("blk.{i}.attn_k_norm.weight", "model.layers.{i}.self_attn.k_norm.weight", optional=True),
    GgufRule("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    GgufRule("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    GgufRule("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
)
# What each family must (True) or must not (False) have among the optional tensors: a GGUF that disagrees
# with its architecture is refused rather than converted into a model that drops weights.
_FAMILY_TENSORS = {
    "llama": {"attn_q.bias": False, "attn_q_norm.weight": False},
    "qwen2": {"attn_q.bias": True, "attn_q_norm.weight": False},
    "qwen3": {"attn_q.bias": False, "attn_q_norm.weight": True},
}


def _require_gguf():
    try:
        import gguf
    except ImportError as e:
        raise ConversionError(f"reading a GGUF file needs the `gguf` package (pip install gguf torch): {e}") from None
    return gguf


def _field(reader: GgufFile, key: str, default: Any = KeyError) -> Any:
    """A metadata value. GGUF stores floats as float32: they come back as the shortest decimal that is that
    float32 (1e-05, as the HF config.json it was made from says, not 9.999999747378752e-06)."""
    f = reader.fields.get(key)
    if f is None:
        if default is KeyError:
            raise ConversionError(f"{reader.path}: GGUF metadata lacks {key!r}")
        return default
    v = f.contents()
    if isinstance(v, float):
        return float(str(np.float32(v)))
    return v


def sha256_file(path: str | Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def gguf_summary(path: str | Path, reader: GgufFile | None = None) -> dict[str, Any]:
    """What a converted folder records about its source: file name, sha256, llama.cpp's file type (e.g.
    MOSTLY_Q4_1) and how many tensors each storage type holds (e.g. {"Q4_1": 210, "Q8_0": 1, "F32": 61})."""
    gguf = _require_gguf()
    reader = reader if reader is not None else open_gguf(path)
    ft = _field(reader, "general.file_type", None)
    try:
        file_type = gguf.LlamaFileType(int(ft)).name if ft is not None else None
    except ValueError:
        file_type = str(ft)
    types = Counter(t.tensor_type.name for t in reader.tensors)
    return {"file": Path(path).name, "sha256": sha256_file(path),
            "architecture": _field(reader, "general.architecture"), "name": _field(reader, "general.name", None),
            "file_type": file_type,
            "tensor_types": dict(sorted(types.items())), "gguf_version": _field(reader, "GGUF.version", None)}


@dataclasses.dataclass(frozen=True)
class GgufFile:
    """A GGUF file opened with gguf-py's reader (memory-mapped: tensors are read when dequantized)."""

    path: Path
    reader: Any

    @property
    def fields(self) -> Any:
        return self.reader.fields

    @property
    def tensors(self) -> Any:
        return self.reader.tensors


def open_gguf(path: str | Path) -> GgufFile:
    gguf = _require_gguf()
    p = Path(path)
    if not p.is_file():
        raise ConversionError(f"{p}: no such GGUF file")
    try:
        return GgufFile(p, gguf.GGUFReader(p))
    except Exception as e:  # gguf raises ValueError / struct.error on a file that is not GGUF or is cut short
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConversionError(f"{p}: not a readable GGUF file (truncated or another format?): {first}") from None


# ----------------------------------------------------------------------------------------------
# Metadata -> ModelConfig


def model_config_from_gguf(reader: GgufFile) -> ModelConfig:
    """The architecture a GGUF file's metadata describes, as our ModelConfig (ConversionError if unsupported)."""
    f = reader.path
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ConversionError(f"{f}: GGUF architecture {arch!r} is not supported; supported: "
                              f"{', '.join(ARCHITECTURES)}")

    def get(key: str, default: Any = KeyError) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:  # llama3-style scaling, stored as per-frequency factors, not parameters
        raise ConversionError(f"{f}: RoPE frequency factors (rope_freqs.weight, Llama-3.1+ scaling) are not read from "
                              "GGUF; convert the Hugging Face checkpoint with --from-hf instead")
    scaling = get("rope.scaling.type", "none")
    rope_scaling = None
    if scaling == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif scaling not in ("none", None):
        raise ConversionError(f"{f}: RoPE scaling {scaling!r} is not supported (supported: none, linear)")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ConversionError(f"{f}: partial rotary embeddings (rope.dimension_count {get('rope.dimension_count')} "
                              f"of head_dim {head_dim}) are not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(get("vocab_size", len(tokens.data) if tokens is not None else KeyError))
    tok = lambda k: _field(reader, f"tokenizer.ggml.{k}", None)  # noqa: E731
    for family_tensor, want in _FAMILY_TENSORS[arch].items():
        if ("blk.0." + family_tensor in names) != want:
            need = "needs" if want else "has no"
            raise ConversionError(f"{f}: architecture {arch} {need} tensor blk.N.{family_tensor}")
    values = dict(
        model_type=arch, vocab_size=vocab, hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")), num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)), head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)), rope_scaling=rope_scaling,
        max_position_embeddings=int(get("context_length", 2048)), tie_embeddings="output.weight" not in names,
        attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
        bos_token_id=tok("bos_token_id"), eos_token_id=tok("eos_token_id"), pad_token_id=tok("padding_token_id"),
    )
    values = {k: int(v) if k.endswith("_token_id") and v is not None else v for k, v in values.items()}
    try:
        return from_dict(ModelConfig, values)
    except ConfigError as e:
        raise ConversionError(f"{f}: {e}") from None


# ----------------------------------------------------------------------------------------------
# Tensors


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's row order of a Llama q/k projection [n_head * head_dim, d]: it stores each head's
    rotary pairs interleaved (x0, x_{hd/2}, x1, ...), transformers half-split (x0..x_{hd/2-1}, x_{hd/2}..)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantized(reader_tensor: Any, gguf: Any) -> np.ndarray:
    """One tensor as float32 numpy in HF (row-major, torch) shape: GGUF lists dims fastest first."""
    shape = tuple(int(n) for n in reversed(reader_tensor.shape.tolist()))
    x = gguf.quants.dequantize(reader_tensor.data, reader_tensor.tensor_type)
    return np.asarray(x, np.float32).reshape(shape)


def hf_tensors(reader: GgufFile, cfg: ModelConfig, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Every tensor of `reader` under its HF name, dequantized to `dtype`. Unknown or missing tensors raise."""
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)

    from dlr_jax.convert.tensors import check_finite

    gguf = _require_gguf()
    by_name = {t.name: t for t in reader.tensors}
    out: dict[str, np.ndarray] = {}
    used: set[str] = set()
    heads = {"q": cfg.num_heads, "k": cfg.num_kv_heads}
    for rule in GGUF_RULES:
        layers = range(cfg.num_layers) if "{i}" in rule.gguf else [None]
        for i in layers:
            src = rule.gguf if i is None else rule.gguf.replace("{i}", str(i))
            dst = rule.hf if i is None else rule.hf.replace("{i}", str(i))
            t = by_name.get(src)
            if t is None:
                if rule.optional:
                    continue
                raise ConversionError(f"{reader.path}: GGUF tensor {src!r} is missing ({cfg.model_type}, "
                                      f"{cfg.num_layers} layers)")
            x = _dequantized(t, gguf)
            if rule.unpermute and cfg.model_type == "llama":
                x = unpermute_qk(x, heads[rule.unpermute])
            check_finite(x, src, reader.path)
            out[dst] = x.astype(np.dtype(dtype))
            used.add(src)
    extra = sorted(set(by_name) - used)
    if extra:
        raise ConversionError(f"{reader.path}: {len(extra)} GGUF tensor(s) this conversion does not know: "
                              f"{', '.join(extra[:8])}{' ...' if len(extra) > 8 else ''}")
    return out


# ----------------------------------------------------------------------------------------------
# The folder


def save_tokenizer(path: Path, out: Path) -> None:
    """transformers' rebuild of the file's tokenizer (see the module docstring), saved as tokenizer.json +
    tokenizer_config.json (+ chat_template.jinja)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # transformers is a dependency; its GGUF path also imports torch
        raise ConversionError(f"the GGUF tokenizer is rebuilt by transformers, which needs torch here "
                              f"(pip install torch): {e}") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ImportError, ValueError, KeyError) as e:
        raise ConversionError(f"{path}: transformers cannot rebuild its tokenizer: {e}") from None
    tok.save_pretrained(str(out))


def convert_gguf(path: str | Path, out_dir: str | Path, *, dtype: str = "float32", force: bool = False,
                 log: Callable[[str], None] | None = None) -> Path:
    """Writes the HF folder of GGUF file `path` to `out_dir` (see the module docstring) and returns it.

    The folder appears whole or not at all (written beside it, then renamed): a conversion killed halfway
    leaves no folder that looks finished. An existing non-empty `out_dir` is refused unless `force`."""
    from dlr_jax.convert.decoder import hf_config_dict
    from dlr_jax.convert.tensors import write_safetensors
    from dlr_jax.models.hf_config import model_config_from_hf

    if dtype not in DTYPES:
        raise ConversionError(f"--dtype {dtype!r} for a GGUF conversion: choose one of {', '.join(DTYPES)}")
    say = log or (lambda s: None)
    path, out = Path(path), Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConversionError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise ConversionError(f"{out}: exists and is not empty; pass --force to replace it")
    reader = open_gguf(path)
    cfg = model_config_from_gguf(reader)
    say(f"{path.name}: {cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}")
    summary = gguf_summary(path, reader)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tensors = hf_tensors(reader, cfg, dtype)
        if tensors["model.embed_tokens.weight"].shape[0] != cfg.vocab_size:
            raise ConversionError(f"{path}: token_embd has {tensors['model.embed_tokens.weight'].shape[0]} rows, "
                                  f"metadata says vocab_size {cfg.vocab_size}")
        write_safetensors(tmp, tensors)
        del tensors
        say("tokenizer (transformers' GGUF tokenizer rebuild)")
        save_tokenizer(path, tmp)
        hf = hf_config_dict(cfg, dtype) | {FORMAT_KEY: summary | {"dequantized_to": dtype}}
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        model_config_from_hf(tmp)  # what init_from will read: fails here, not at a stage
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def gguf_record(hf_dir: str | Path) -> dict[str, Any] | None:
    """The `dlr_jax_gguf` record of a folder written by `convert_gguf` (None for any other checkpoint)."""
    f = Path(hf_dir) / "config.json"
    try:
        return json.loads(f.read_text()).get(FORMAT_KEY)
    except (OSError, json.JSONDecodeError):
        return None


def is_gguf_file(path: str | Path) -> bool:
    """A `.gguf` name, or a file starting with GGUF's magic bytes."""
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def converted_for_run(path: str | Path, workdir: str | Path, *, dtype: str = "float32",
                      log: Callable[[str], None] | None = print) -> Path:
    """`init_from=FILE.gguf` of a training run: the file converted into `<workdir>/init_from/<stem>` once (the
    first stage, under a file lock so that several processes convert it once) and reused while its sha256 is
    the one recorded there. Returns the absolute folder, which the run then records as its init_from."""
    import fcntl

    path = Path(path).absolute()
    if not path.is_file():
        raise ConversionError(f"init_from={path}: no such GGUF file")
    out = (Path(workdir) / "init_from" / path.stem).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rec = gguf_record(out)
        if rec is not None and rec.get("sha256") == sha256_file(path) and rec.get("dequantized_to") == dtype:
            return out
        if log:
            log(f"[init_from] converting {path} into {out} (once for this workdir)")
        return convert_gguf(path, out, dtype=dtype, force=True, log=log)
