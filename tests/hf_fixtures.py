"""Tiny random Hugging Face decoder models, saved locally (no hub access), for parity tests.

Norm weights and biases are randomised (HF initialises them to ones / zeros), so a conversion that
dropped or swapped them would change the logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_vl")
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}


def tiny_text_kwargs(**overrides: Any) -> dict[str, Any]:
    return dict(vocab_size=112, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256) | overrides


def build_tiny_hf(family: str, *, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A tiny random HF model of `family` in eval mode: llama (llama3 rope scaling, tied
    embeddings), qwen2 (q/k/v biases), qwen3 (q/k norm, head_dim != hidden/heads), qwen3_vl."""
    import transformers as tf

    torch.manual_seed(seed)
    text = tiny_text_kwargs(**overrides)
    if family == "llama":
        cfg = tf.LlamaConfig(**({"tie_word_embeddings": True, "rope_parameters": {**LLAMA3_ROPE,
                             "rope_theta": 500000.0}} | text))
        model = tf.LlamaForCausalLM(cfg)
    elif family == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**({"tie_word_embeddings": False} | text)))
    elif family == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**({"head_dim": 32, "tie_word_embeddings": False} | text)))
    elif family == "qwen3_vl":
        text = {"head_dim": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                "mrope_section": [2, 3, 3], "mrope_interleaved": True}} | text
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                      patch_size=8, spatial_merge_size=2, temporal_patch_size=2,
                      num_position_embeddings=16, deepstack_visual_indexes=[0])
        cfg = tf.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model = tf.Qwen3VLForConditionalGeneration(cfg)
    else:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def save_tiny_hf(family: str, out_dir: Path, **kwargs: Any) -> torch.nn.Module:
    model = build_tiny_hf(family, **kwargs)
    model.save_pretrained(out_dir)
    return model


def hf_logits(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits.float().numpy()


def random_ids(vocab: int, shape: tuple[int, int] = (2, 24), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, shape)


# ---- checkpoints with a tokenizer, as a user downloads them ---------------------------------------

_SPECIALS = {  # (bos, eos, extra specials) per family, as the published checkpoints name them
    "llama": ("<|begin_of_text|>", "<|end_of_text|>", ("<|eot_id|>",)),
    "qwen3": (None, "<|endoftext|>", ("<|im_start|>", "<|im_end|>")),
    "qwen3_vl": (None, "<|endoftext|>", ("<|im_start|>", "<|im_end|>")),
    "qwen2": (None, "<|endoftext|>", ("<|im_start|>", "<|im_end|>")),
}


def save_tokenizer(out_dir: Path, family: str, *, fill_rows: int | None = None) -> int:
    """A byte-level tokenizer (every byte is a token, so any text encodes) with the family's special
    tokens; `fill_rows`: add reserved tokens until the vocabulary has exactly that many ids, as Llama-3's
    tokenizer fills all 128,256 embedding rows. Writes tokenizer.json + tokenizer_config.json; returns
    the number of ids."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    bos, eos, extra = _SPECIALS[family]
    specials = [t for t in (bos, eos, *extra) if t]
    n = len(vocab) + len(specials)
    if fill_rows is not None:
        if fill_rows < n:
            raise ValueError(f"fill_rows={fill_rows} < {n} base tokens")
        specials += [f"<|reserved_special_token_{i}|>" for i in range(fill_rows - n)]
    tok.add_special_tokens(specials)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {"eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    if bos:
        cfg["bos_token"] = bos
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tok.get_vocab_size(with_added_tokens=True)


def save_tiny_checkpoint(family: str, out_dir: Path, *, vocab_size: int = 320, fill_vocab: bool = False,
                         **overrides: Any) -> torch.nn.Module:
    """A tiny random HF checkpoint of `family` with a tokenizer, as `from_pretrained` dirs look.
    fill_vocab: the tokenizer has exactly `vocab_size` ids (no free embedding row: every added token
    needs the embedding to grow); otherwise it has fewer ids than rows, as Qwen's does."""
    n = save_tokenizer(out_dir, family, fill_rows=vocab_size if fill_vocab else None)
    assert n <= vocab_size
    model = build_tiny_hf(family, vocab_size=vocab_size, **overrides)
    model.save_pretrained(out_dir)
    return model
