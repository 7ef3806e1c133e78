"""Scoring one generated sequence for `dlr_jax.eval.evaluate`: the answer it gives, whether it is right, its
reasoning length #L as the paper counts it, and whether a latent-mode generation keeps the format.

Under the paper's dynamic decoding nothing forces the output grammar, so a generation may be
`<latent> z.. </latent> text <answer> a </answer>`, lack the answer span, or carry latent ids after the span:
the answer is read from the `<answer>` span only (`eval.answer_fallback: off`, the paper's reading) unless the
fallback is asked for, and #L counts the latents of the first span only (`latent_span`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlr_jax.config.stages import ANSWER_FALLBACKS
from dlr_jax.data.formats import parse_generation
from dlr_jax.data.records import Example
from dlr_jax.rewards.answer_format import extract_answer, format_reward, is_correct
from dlr_jax.text.tokens import Tokenizer


def score_one(tok: Tokenizer, ex: Example, benchmark: str, gen: np.ndarray, finished: bool, seed: int,
              mode: str, *, answer_fallback: str = "off") -> dict[str, Any]:
    """One generated sequence of `ex` as a samples.jsonl row: the answer read (`read_answer`; `answer_fallback`
    True when the fallback gave it), whether it is right, #L, the latent codes; `format_ok` (latent mode) whether
    it follows the latent/answer grammar. In latent mode `n_latents`, `L` and `latent_codes` are the first span's;
    `latents_outside` counts latent ids generated anywhere else."""
    parsed = parse_generation(tok, gen)
    pred, fell_back = read_answer(parsed.text, answer_fallback)
    codes = parsed.codes
    if mode == "latent":
        codes = [i - tok.latent_offset for i in latent_span(tok, gen)]
    row = {
        "id": ex.id, "seed": seed, "question": ex.question, "gold": ex.answer, "prediction": parsed.text,
        "answer": pred, "answer_fallback": fell_back, "correct": bool(is_correct(pred, ex.answer, benchmark)),
        "n_latents": len(codes), "L": reasoning_length(tok, gen, mode, len(codes)),
        "latent_codes": codes, "gen_tokens": int(gen.shape[0]), "finished": finished,
    }
    if mode == "latent":
        row["latents_outside"] = parsed.n_latents - len(codes)
        row["format_ok"] = format_ok(tok, gen)
    return row


def read_answer(text: str, fallback: str = "off") -> tuple[str | None, bool]:
    """(answer, whether the fallback gave it) of a decoded generation (`Parsed.text`: boundary tokens kept,
    latent ids left out). off: the last `<answer>` span only, None without one. last_number:
    `rewards.extract_answer` (the RL answer reward's rule): without a span, its fallbacks (a boxed answer, an
    "answer is" marker, else the last number)."""
    if fallback not in ANSWER_FALLBACKS:
        raise ValueError(f"answer_fallback must be one of {ANSWER_FALLBACKS}, got {fallback!r}")
    if "<answer>" in text:  # extract_answer reads (and cleans) the last span first
        return extract_answer(text), False
    if fallback == "off":
        return None, False
    pred = extract_answer(text)
    return pred, pred is not None


def latent_span(tok: Tokenizer, gen: np.ndarray) -> list[int]:
    """The latent ids of the first latent span: after the first `<latent>`, up to the next `</latent>` (or the
    end of the generation, `<eos>` excluded); [] without a `<latent>`. What the paper's #L counts: latent ids
    written elsewhere (possible without the grammar) are not reasoning in the span."""
    flat = [int(i) for i in np.asarray(gen).reshape(-1)]
    if tok.eos_id in flat:
        flat = flat[: flat.index(tok.eos_id)]
    if tok.latent_start_id not in flat:
        return []
    span = flat[flat.index(tok.latent_start_id) + 1 :]
    if tok.latent_end_id in span:
        span = span[: span.index(tok.latent_end_id)]
    return [i for i in span if tok.is_latent(i)]


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
