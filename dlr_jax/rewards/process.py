"""r_proc, the process-alignment reward of latent GRPO (the paper's stage 3, rl).

For each rollout: take its generated latent codes, decode them with the frozen OCR decoder into a
text CoT y_hat, and ask a frozen *evaluator* LM (the backbone before alignment, e.g. the textsft_cot
model, which has learnt the text-CoT format) to finish

    prompt_ids(tok, question) + enc(y_hat) + <answer>

greedily. Its answer, scored by `rewards.is_correct` against the gold, is r_proc in {0, 1}: a latent
trace that a reader can follow to the right answer is rewarded even when the policy's own answer is
wrong. Rollouts without a well-formed latent span (`<latent>`, at least one latent, `</latent>`)
score 0 and are not decoded.

A codebook that rendered one step a canvas (`codebook.render_unit=step`) trained its decoder to read one step's
codes; with a fixed canvas every step has c = (side / 64)^2 codes (`data.latents.fixed_step_codes`), so the span
is cut into groups of c codes (`data.latents.cut_steps`), each group decoded on its own, and y_hat is the decoded
steps joined with spaces (`step_codes`; None decodes the span as one, as for a whole-chain codebook).

Everything is batched: one `decode` call for all traces, then the evaluator's jitted `Sampler` over
fixed-size chunks (the last one padded with repeats) so the compiled shapes are reused across RL
steps. Registered as reward ``"process"``; the scorer reaches the reward function through
``RewardInputs.extras["process_reward"]`` and the questions through ``RewardInputs.prompts``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from jax.sharding import Mesh

from dlr_jax.data.formats import prompt_ids
from dlr_jax.data.latents import cut_steps
from dlr_jax.generate.sampler import Sampler
from dlr_jax.rewards.answer_format import (
    BoundaryIds,
    RewardInputs,
    extract_answer,
    is_correct,
    latent_ids_per_row,
    register_reward,
)
from dlr_jax.text.tokens import Tokenizer

__all__ = ["LatentDecoder", "ProcessReward", "process_reward", "well_formed_codes"]


@runtime_checkable
class LatentDecoder(Protocol):
    """Anything that turns latent code sequences (codebook row indices, not token ids) into text.

    `decode(codes)` gets one list per trace (lengths differ) and returns one string per trace; the
    codebook stage's OCR decoder implements it with a batched, jitted greedy decode.
    """

    def decode(self, codes: list[list[int]]) -> list[str]: ...


def well_formed_codes(
    completion_ids: np.ndarray, completion_mask: np.ndarray | None, boundary: BoundaryIds
) -> list[list[int] | None]:
    """Per row: the codes of its first latent span, or None when the row has no closed span with at
    least one latent (`latent_ids_per_row` plus the closing `</latent>` check)."""
    ids = np.asarray(completion_ids)
    valid = np.ones(ids.shape, bool) if completion_mask is None else np.asarray(completion_mask).astype(bool)
    out: list[list[int] | None] = []
    for row, ok, codes in zip(ids, valid, latent_ids_per_row(ids, valid, boundary), strict=True):
        row = row[ok]
        start = 0
        if not boundary.latent_start_in_prompt:
            hits = np.flatnonzero(row == boundary.latent_start)
            start = int(hits[0]) + 1 if hits.size else row.shape[0]
        closed = bool(np.any(row[start:] == boundary.latent_end))
        out.append(codes.tolist() if closed and codes.size else None)
    return out


class ProcessReward:
    """Scores latent traces with a frozen decoder + evaluator LM (see the module docstring).

    decoder: a `LatentDecoder`. evaluator: an NNX LM with the sampler interface (`Transformer`) or a
    ready `Sampler` (pass one to share compiled functions). tok: the workdir tokenizer (the evaluator
    shares its text ids). max_new_tokens: the evaluator's budget after `<answer>`; max_cot_tokens: y_hat
    is cut to this many tokens; batch_size: evaluator rows per generate call. step_codes: codes per step of a
    step codebook (see the module docstring), None for a whole-chain codebook.
    """

    def __init__(
        self,
        decoder: LatentDecoder,
        evaluator: Any,
        tok: Tokenizer,
        *,
        max_new_tokens: int = 16,
        max_cot_tokens: int = 256,
        batch_size: int = 64,
        mesh: Mesh | None = None,
        rules: Mapping | str = "fsdp",
        prompt_bucket: int = 64,
        step_codes: int | None = None,
    ):
        if not isinstance(decoder, LatentDecoder):
            raise TypeError(f"decoder {type(decoder).__name__} has no decode(codes) -> list[str] method")
        if min(max_new_tokens, max_cot_tokens, batch_size) < 1:
            raise ValueError(
                f"need max_new_tokens, max_cot_tokens, batch_size >= 1; got {max_new_tokens}, "
                f"{max_cot_tokens}, {batch_size}"
            )
        self.decoder, self.tok = decoder, tok
        self.sampler = (
            evaluator if isinstance(evaluator, Sampler)
            else Sampler(evaluator, mesh=mesh, rules=rules, prompt_bucket=prompt_bucket)
        )
        self.max_new_tokens, self.max_cot_tokens, self.batch_size = max_new_tokens, max_cot_tokens, batch_size
        if step_codes is not None and step_codes < 1:
            raise ValueError(f"step_codes must be >= 1 or None, got {step_codes}")
        self.step_codes = step_codes
        self._vocab_mask: np.ndarray | None = None

    def read(self, codes: Sequence[Sequence[int]]) -> list[str]:
        """y_hat for each trace: its codes decoded in one batched `decode` call, whole or (`step_codes`) one step
        at a time with the decoded steps joined by spaces."""
        traces = [[int(c) for c in z] for z in codes]
        if self.step_codes is None:
            texts = self.decoder.decode(traces)
            if len(texts) != len(traces):
                raise ValueError(f"decoder returned {len(texts)} texts for {len(traces)} traces")
            return texts
        steps = [cut_steps(z, self.step_codes) for z in traces]
        flat = [g for gs in steps for g in gs]
        texts = self.decoder.decode(flat)
        if len(texts) != len(flat):
            raise ValueError(f"decoder returned {len(texts)} texts for {len(flat)} steps")
        read = iter(texts)
        return [" ".join(next(read) for _ in gs) for gs in steps]

    def vocab_mask(self) -> np.ndarray:
        """Bool [evaluator vocab]: known text ids; latent boundaries and latent rows never."""
        if self._vocab_mask is None:
            tok, vocab = self.tok, self.sampler._vocab_size()
            known = tok.vocab_padding_mask()
            mask = np.zeros(vocab, bool)
            n = min(vocab, tok.latent_offset)  # text rows only: the evaluator reads no latents
            mask[:n] = known[:n]
            mask[[i for i in (tok.latent_start_id, tok.latent_end_id) if i < vocab]] = False
            self._vocab_mask = mask
        return self._vocab_mask

    def evaluator_prompt(self, question: str, cot: str) -> list[int]:
        """prompt_ids(question) + enc(y_hat)[:max_cot_tokens] + <answer> (the textsft CoT format). y_hat
        is encoded as plain text: markup an OCR decode spells (`<answer>`, `<z_3>`) stays text."""
        return prompt_ids(self.tok, question) + self.tok.encode_plain(cot)[: self.max_cot_tokens] + [
            self.tok.answer_start_id
        ]

    def answers(self, questions: Sequence[str], cots: Sequence[str]) -> list[str | None]:
        """The evaluator's greedy answer for each (question, y_hat) pair (None if it gives none)."""
        if len(questions) != len(cots):
            raise ValueError(f"got {len(questions)} questions but {len(cots)} CoTs")
        if not questions:
            return []
        tok = self.tok
        prompts = [self.evaluator_prompt(q, c) for q, c in zip(questions, cots, strict=True)]
        n = len(prompts)
        size = min(self.batch_size, n)
        out: list[str | None] = []
        for start in range(0, n, size):
            chunk = prompts[start : start + size]
            chunk = chunk + [chunk[-1]] * (size - len(chunk))  # one compiled batch shape
            res = self.sampler.generate(
                chunk, max_new_tokens=self.max_new_tokens, stop_ids=[tok.answer_end_id, tok.eos_id],
                pad_id=tok.pad_id, vocab_mask=self.vocab_mask(),
            )
            for r in range(min(size, n - start)):
                gen = res.tokens[r, : res.lengths[r]].tolist()
                out.append(extract_answer("<answer>" + tok.decode(gen)))
        return out

    def score(
        self,
        questions: Sequence[str],
        codes: Sequence[Sequence[int] | None],
        golds: Sequence[str],
        benchmark: str,
    ) -> np.ndarray:
        """r_proc [B] float32: decode every trace (None = malformed, scores 0), evaluate, compare."""
        if not len(questions) == len(codes) == len(golds):
            raise ValueError(f"got {len(questions)} questions, {len(codes)} traces, {len(golds)} golds")
        rows = [i for i, c in enumerate(codes) if c]
        reward = np.zeros((len(codes),), np.float32)
        if not rows:
            return reward
        cots = self.read([codes[i] for i in rows])
        answers = self.answers([questions[i] for i in rows], cots)
        for i, a in zip(rows, answers, strict=True):
            reward[i] = float(is_correct(a, golds[i], benchmark))
        return reward

    def __call__(self, inputs: RewardInputs) -> np.ndarray:
        if inputs.completion_ids is None or inputs.boundary is None or inputs.prompts is None:
            raise ValueError(
                "the 'process' reward needs RewardInputs.completion_ids, .boundary and .prompts (the questions)"
            )
        codes = well_formed_codes(inputs.completion_ids, inputs.completion_mask, inputs.boundary)
        return self.score(inputs.prompts, codes, inputs.golds, inputs.benchmark)


@register_reward("process")
def process_reward(inputs: RewardInputs) -> np.ndarray:
    """Reward ``"process"``: ``inputs.extras["process_reward"]`` (a `ProcessReward`) scores the batch."""
    scorer = inputs.extras.get("process_reward")
    if scorer is None:
        raise ValueError(
            "the 'process' reward needs RewardInputs.extras['process_reward'] = ProcessReward(decoder, "
            "evaluator, tok); without an OCR decoder set its weight to 0 (rl.process_weight=0)"
        )
    return scorer(inputs)
