"""Every token layout the stages train on, in one place; evaluation imports `prompt_ids` from here.

Notation (the paper's): x = prompt, y = textual CoT, z = latent ids, a = answer text.

    prompt       x = [<bos>] + enc(question.strip()) + enc("\\n")
    textsft/cot  [x ; enc(y) <answer> enc(a) </answer> <eos>]               loss after x
    textsft/dir  [x ; <answer> enc(a) </answer> <eos>]                       loss after x
    align        [<bos>] [z ; enc(y) <eos>]                                  loss on every position >= 1
    sft          [x ; <latent> z </latent> <answer> enc(a) </answer> <eos>]  loss after x
    sft mixed    [x ; <latent> z_1..z_k </latent> enc(y_k+1..S) <answer> enc(a) </answer> <eos>]
                 loss after x; the latent curriculum (`data.curriculum`): the codes of the first k of the
                 CoT's S steps, then the text of the rest (k = 0: an empty span, then y; k = S: sft)

Choices that evaluation and RL rely on (change them only together with the consumers):

* `<bos>` is prepended when the tokenizer has one (Llama / our BPE); Qwen tokenizers have none.
* The separator `PROMPT_SEP = "\\n"` is encoded on its own, never merged with the question's last
  characters, so every prompt ends in the same ids and generation starts on a clean boundary.
* The answer is encoded bare, with no leading space: `<answer>42</answer>`. `parse_generation`
  decodes the span and strips whitespace, so a model that emits a space still parses.
* The CoT y follows x directly (no extra separator) and `<answer>` follows y directly.
* `loss_mask[t] = 1` means token t is a target, predicted from tokens[:t]. Position 0 is never a
  target, so sequences can be packed back to back without one predicting across a boundary.
  A loss reads `logits[:, :-1]` against `tokens[:, 1:]` weighted by `loss_mask[:, 1:]`.

Latents are passed as code indices k in [0, K) (what `latents/<split>.jsonl` stores) and become
vocabulary ids `tok.latent_id(k)` here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq

import numpy as np

from dlr_jax.text.tokens import Tokenizer

PROMPT_SEP = "\n"
TEXTSFT_MODES = ("cot", "direct")


@dataclasses.dataclass(frozen=True)
class Sequence:
    """tokens: int32 [T]; loss_mask: int8 [T], 1 where tokens[t] is a target (predicted from < t)."""

    tokens: np.ndarray
    loss_mask: np.ndarray

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_targets(self) -> int:
        return int(self.loss_mask.sum())


def _seq(context: Seq[int], target: Seq[int]) -> Sequence:
    """context is conditioned on (mask 0), target is predicted (mask 1); position 0 never is."""
    tokens = np.asarray([*context, *target], dtype=np.int32)
    mask = np.zeros(tokens.shape[0], dtype=np.int8)
    mask[len(context) :] = 1
    mask[:1] = 0
    return Sequence(tokens, mask)


def prompt_ids(tok: Tokenizer, question: str) -> list[int]:
    """x = [<bos>] + enc(question.strip()) + enc(PROMPT_SEP); the model's input at evaluation."""
    bos = [tok.bos_id] if tok.bos_id is not None else []
    return bos + tok.encode(question.strip()) + tok.encode(PROMPT_SEP)


def answer_ids(tok: Tokenizer, answer: str) -> list[int]:
    """<answer> enc(a) </answer> <eos>, the answer encoded bare (no leading space)."""
    return [tok.answer_start_id, *tok.encode(answer.strip()), tok.answer_end_id, tok.eos_id]


def textsft_sequence(tok: Tokenizer, question: str, cot: str, answer: str, mode: str = "cot") -> Sequence:
    """Text-CoT SFT (the baseline / warm-up): `cot` -> [x ; y <answer> a </answer> <eos>],
    `direct` -> [x ; <answer> a </answer> <eos>]; loss after x."""
    if mode not in TEXTSFT_MODES:
        raise ValueError(f"textsft mode must be one of {TEXTSFT_MODES}, got {mode!r}")
    x = prompt_ids(tok, question)
    y = tok.encode(cot) if mode == "cot" else []
    return _seq(x, y + answer_ids(tok, answer))


def align_sequence(tok: Tokenizer, latents: Seq[int], cot: str) -> Sequence:
    """Stage 1: [<bos>] [z ; y <eos>], loss on every position that has a predecessor."""
    if len(latents) == 0:
        raise ValueError("align_sequence needs at least one latent code")
    bos = [tok.bos_id] if tok.bos_id is not None else []
    return _seq([], bos + tok.latent_ids(latents) + tok.encode(cot) + [tok.eos_id])


def sft_sequence(tok: Tokenizer, question: str, latents: Seq[int], answer: str) -> Sequence:
    """Stage 2: [x ; <latent> z </latent> <answer> a </answer> <eos>], loss after x."""
    x = prompt_ids(tok, question)
    z = [tok.latent_start_id, *tok.latent_ids(latents), tok.latent_end_id]
    return _seq(x, z + answer_ids(tok, answer))


def mixed_sequence(tok: Tokenizer, question: str, latents: Seq[int], text: str, answer: str) -> Sequence:
    """The latent curriculum's row: [x ; <latent> z </latent> enc(text) <answer> a </answer> <eos>], loss after x.

    latents: the codes of the first k steps (may be empty: the span is still opened and closed, so the
    format reward and `parse_generation` read every row alike); text: the CoT's remaining steps, right
    after `</latent>` (empty: exactly `sft_sequence`)."""
    x = prompt_ids(tok, question)
    z = [tok.latent_start_id, *tok.latent_ids(latents), tok.latent_end_id]
    return _seq(x, z + (tok.encode(text) if text else []) + answer_ids(tok, answer))


@dataclasses.dataclass(frozen=True)
class Parsed:
    """What a generation (the ids after the prompt) says.

    latent_ids:  the latent vocabulary ids generated, in order (before the first <eos>).
    answer_text: the stripped text inside the last <answer> ... </answer> span (an unclosed final
                 span runs to the end); None when there is no <answer>. No number fallback here:
                 `dlr_jax.rewards.answer_format.extract_answer(text)` adds that.
    text:        the generation decoded up to the first <eos>, boundary tokens kept, latent ids
                 left out (so a last-number fallback can never read digits out of `<z_k>`).
    n_latents:   len(latent_ids), the per-sample #L.
    codes:       latent_ids as code indices k (rows of the codebook).
    """

    latent_ids: list[int]
    answer_text: str | None
    text: str
    n_latents: int
    codes: list[int] = dataclasses.field(default_factory=list)


def parse_generation(tok: Tokenizer, ids: Seq[int] | np.ndarray) -> Parsed:
    """Splits generated ids (prompt excluded) into latents, answer and text; see `Parsed`."""
    flat = [int(i) for i in np.asarray(ids).reshape(-1)]
    if tok.eos_id in flat:
        flat = flat[: flat.index(tok.eos_id)]
    flat = [i for i in flat if i != tok.pad_id]
    latent_ids = [i for i in flat if tok.is_latent(i)]
    rest = [i for i in flat if not tok.is_latent(i)]
    answer_text = None
    if tok.answer_start_id in rest:
        start = len(rest) - rest[::-1].index(tok.answer_start_id)
        span = rest[start:]
        if tok.answer_end_id in span:
            span = span[: span.index(tok.answer_end_id)]
        answer_text = tok.decode(span, skip_special_tokens=True).strip()
    return Parsed(
        latent_ids=latent_ids,
        answer_text=answer_text,
        text=tok.decode(rest),
        n_latents=len(latent_ids),
        codes=[i - tok.latent_offset for i in latent_ids],
    )
