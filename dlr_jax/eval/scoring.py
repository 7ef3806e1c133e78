"""Scoring one generated sequence for `dlr_jax.eval.evaluate`: the answer it gives, whether it is right, its
reasoning length #L as the paper counts it, and whether a latent-mode generation keeps the format."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlr_jax.data.formats import parse_generation
from dlr_jax.data.records import Example
from dlr_jax.rewards.answer_format import extract_answer, format_reward, is_correct
from dlr_jax.text.tokens import Tokenizer


def score_one(tok: Tokenizer, ex: Example, benchmark: str, gen: np.ndarray, finished: bool, seed: int,
              mode: str) -> dict[str, Any]:
    """One generated sequence of `ex` as a samples.jsonl row: the answer read, whether it is right, #L, the
    latent codes; `format_ok` (latent mode) whether it follows the latent/answer grammar."""
    parsed = parse_generation(tok, gen)
    pred = extract_answer(parsed.text)
    row = {
        "id": ex.id, "seed": seed, "question": ex.question, "gold": ex.answer, "prediction": parsed.text,
        "answer": pred, "correct": bool(is_correct(pred, ex.answer, benchmark)),
        "n_latents": parsed.n_latents, "L": reasoning_length(tok, gen, mode, parsed.n_latents),
        "latent_codes": parsed.codes, "gen_tokens": int(gen.shape[0]), "finished": finished,
    }
    if mode == "latent":
        row["format_ok"] = format_ok(tok, gen)
    return row


def format_ok(tok: Tokenizer, gen: np.ndarray) -> bool:
    """`<latent> z... </latent> <answer> ... </answer>` (the format reward's rule) with this tokenizer's ids."""
    return bool(format_reward(
        gen, latent_start_id=tok.latent_start_id, latent_end_id=tok.latent_end_id,
        answer_start_id=tok.answer_start_id, answer_end_id=tok.answer_end_id,
        is_latent=(tok.latent_offset, tok.num_latents)))


def reasoning_length(tok: Tokenizer, gen: np.ndarray, mode: str, n_latents: int) -> int:
    """#L of one generation: latents (latent mode), CoT tokens before `<answer>` (cot), 0 (direct)."""
    if mode == "latent":
        return int(n_latents)
    if mode == "direct":
        return 0
    gen = np.asarray(gen)
    hits = np.flatnonzero(gen == tok.answer_start_id)
    end = int(hits[0]) if hits.size else int(np.sum(~np.isin(gen, [tok.eos_id, tok.pad_id])))
    return end
