"""`python -m dlr_jax.convert`: HF safetensors <-> Orbax, and a trained workdir stage out to HF.

    python -m dlr_jax.convert --from-hf HF_DIR --out ORBAX_DIR [--mesh data=1,fsdp=8,tensor=1]
    python -m dlr_jax.convert --to-hf --from-orbax ORBAX_DIR --out HF_DIR [--force]
    python -m dlr_jax.convert --to-hf --from-workdir W --stage sft|rl --out HF_DIR   (workdir_export.py)
    python -m dlr_jax.convert --from-gguf FILE.gguf --out HF_DIR [--dtype bfloat16]  (gguf.py: an HF folder)

A deepseek_ocr2 directory goes through convert/ocr2.py, everything else through convert/decoder.py.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path

import jax

from dlr_jax.convert import ocr2 as o2
from dlr_jax.convert.decoder import load_hf, load_orbax, save_hf, save_orbax
from dlr_jax.convert.gguf import convert_gguf
from dlr_jax.convert.workdir_export import check_out_apart, export_stage, prepare_out_dir
from dlr_jax.core.sharding import make_mesh, parse_mesh_spec
from dlr_jax.models.hf_config import ConversionError, supported_model_types
from dlr_jax.run.checkpoint import CheckpointUnreadable

# Tokenizer files a conversion carries over beside the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model")


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and jax.process_index() == 0:
            shutil.copy2(src / name, dst / name)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m dlr_jax.convert",
        description="HF safetensors <-> Orbax checkpoints of the dlr_jax Transformer "
        f"(model_type: {supported_model_types()}, deepseek_ocr2; qwen3_vl imports the text tower, exports as qwen3).",
        epilog="examples:\n  python -m dlr_jax.convert --from-hf ~/hf/Llama-3.2-1B --out ckpt/llama1b\n"
        "  python -m dlr_jax.convert --to-hf --from-orbax ckpt/llama1b --out hf_out/\n"
        "  python -m dlr_jax.convert --from-gguf SmolLM2-135M-Instruct.Q4_1.gguf --out weights/smollm2-135m",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--from-hf", type=Path, metavar="DIR",
                    help="HF model dir (config.json + safetensors) to import")
    ap.add_argument("--from-gguf", type=Path, metavar="FILE",
                    help="a llama.cpp GGUF file (llama, qwen2, qwen3) to write as an HF folder (config.json, "
                    "safetensors, tokenizer) that init_from reads; quantized tensors are dequantized (to --dtype, "
                    "default float32) and config.json records from what")
    ap.add_argument("--to-hf", action="store_true", help="export --from-orbax DIR as HF safetensors")
    ap.add_argument("--from-orbax", type=Path, metavar="DIR",
                    help="directory written by --from-hf (with --to-hf)")
    ap.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    ap.add_argument("--mesh", default="data=1,fsdp=-1,tensor=1",
                    help="mesh to place params on while converting (default: all devices on fsdp)")
    ap.add_argument("--rules", default="fsdp", help="logical-axis rules profile (fsdp | tp | tpu)")
    ap.add_argument("--dtype", default=None, help="parameter dtype to store (default: float32 on import; on export "
                    "the Orbax checkpoint's own, and float32 from a workdir, whose stages keep fp32 weights: pass "
                    "bfloat16 for a checkpoint the size of a bf16 original)")
    ap.add_argument("--from-workdir", type=Path, metavar="DIR",
                    help="with --to-hf: a training workdir; exports --stage's final model (latent rows included)")
    ap.add_argument("--stage", default="sft", help="with --from-workdir: sft | rl | align | textsft_cot | ...")
    ap.add_argument("--force", action="store_true",
                    help="overwrite an existing Orbax checkpoint, or (--to-hf) replace a non-empty --out")
    args = ap.parse_args(argv)
    if args.from_gguf is not None:
        if args.to_hf or any(x is not None for x in (args.from_hf, args.from_orbax, args.from_workdir)):
            ap.error("--from-gguf FILE --out DIR stands alone (no --to-hf, --from-hf, --from-orbax, --from-workdir)")
        try:
            check_out_apart(args.out, args.from_gguf)
            out = convert_gguf(args.from_gguf, args.out, dtype=args.dtype or "float32", force=args.force, log=print)
        except ConversionError as e:
            raise SystemExit(f"error: {e}") from None
        print(f"wrote {out} (Hugging Face folder; init_from={out} reads it)")
        return
    sources = (args.from_orbax is not None) + (args.from_workdir is not None)
    if args.to_hf == (args.from_hf is not None) or (args.to_hf and sources != 1):
        ap.error("use exactly one of: --from-hf DIR   or   --to-hf --from-orbax DIR   or   --to-hf --from-workdir W")
    try:
        mesh = make_mesh(**parse_mesh_spec(args.mesh))
    except ValueError as e:  # a malformed spec, or more devices than this machine has
        ap.error(f"--mesh {args.mesh}: {e}")
    try:
        # every --from-* source: --force must never clear what the conversion reads
        check_out_apart(args.out, *(v for k, v in vars(args).items() if k.startswith("from_") and v is not None))
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
    except (ConversionError, CheckpointUnreadable) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {out} ({cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size})")
