"""dlr_jax: Discrete Latent Reasoning in JAX/Flax NNX.

The names a researcher scripts against, imported on first use so that `import dlr_jax` stays cheap
(no jax, no transformers until a name is touched):

- `load_config(path, overrides)`: a YAML config with `--set`-style overrides, checked.
- `load_hf(hf_dir)` / `save_hf(...)`: a `transformers` checkpoint in and out (Llama, Qwen2/3, Qwen3-VL text,
  DeepSeek-OCR-2), as `(config, model)`; `model(input_ids) -> logits [B, T, V]`.
- `render_cot(text)`: a chain of thought as an image and its visual token count N.
- `quantize(h, codebook)`: nearest-code ids, straight-through features and the VQ losses.
- `Sampler`: jitted prefill + while-loop decoding over a KV cache.
- `grpo_loss(...)`, `group_advantages(...)`: the GRPO maths (TRL's semantics, k3 KL).
- `extract_answer(text)`, `is_correct(prediction, gold, benchmark)`: answer scoring, signs kept.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "load_config": "dlr_jax.config",
    "load_hf": "dlr_jax.convert.decoder",
    "save_hf": "dlr_jax.convert.decoder",
    "render_cot": "dlr_jax.text.render",
    "quantize": "dlr_jax.models.vq",
    "Sampler": "dlr_jax.generate.sampler",
    "grpo_loss": "dlr_jax.stages.rl.grpo",
    "group_advantages": "dlr_jax.stages.rl.grpo",
    "extract_answer": "dlr_jax.text.answers",
    "is_correct": "dlr_jax.text.answers",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dlr_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
