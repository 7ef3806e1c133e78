"""Rewards for the RL stage: answer, format and the registry (the process reward lives in
``dlr_jax.rewards.process``). Answer scoring (:func:`extract_answer`, :func:`is_correct`) is in
``dlr_jax.text.answers`` and re-exported here, shared with ``evaluate.py`` so Pass@1 and R_ans never disagree.

Reward functions. The RL stage sums registered rewards with weights (:func:`combine_rewards`). A reward
function takes a :class:`RewardInputs` and returns ``np.ndarray [B]`` float32. Register your own with
``@register_reward("name")``. Built in: ``"answer"`` (R_ans), ``"format"`` (R_fmt) and, registered by
``dlr_jax.rewards.process``, ``"process"`` (r_proc): for each rollout, decode the generated latent ids
(:func:`latent_ids_per_row`) with the frozen OCR decoder into a text CoT ``y_hat``; prompt the frozen
evaluator LM (the backbone before alignment) with the question ``x`` and ``y_hat``; score its greedy
answer with :func:`is_correct` against the gold; 1.0/0.0 per rollout (0.0 when the rollout has no
well-formed latent span). Models and tokenizers reach it through ``RewardInputs.extras``, never globals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlr_jax.text.answers import (
    KNOWN_BENCHMARKS,
    answer_reward,
    extract_answer,
    is_correct,
)

__all__ = [
    "KNOWN_BENCHMARKS",
    "BoundaryIds",
    "RewardInputs",
    "answer_reward",
    "combine_rewards",
    "extract_answer",
    "format_reward",
    "format_reward_batch",
    "get_reward",
    "is_correct",
    "latent_ids_per_row",
    "list_rewards",
    "register_reward",
]

# ----------------------------------------------------------------------------------------------- format


@dataclass(frozen=True)
class BoundaryIds:
    """Token ids of the boundary tokens and the latent id range ``[latent_offset, latent_offset + num)``.

    ``latent_start_in_prompt``: the prompt already ends with ``<latent>`` (the sampler forces the latent
    phase), so completions start inside the latent span and must not contain ``<latent>`` themselves.
    """

    latent_start: int
    latent_end: int
    answer_start: int
    answer_end: int
    latent_offset: int
    num_latents: int
    latent_start_in_prompt: bool = False


IsLatent = Callable[[Any], Any] | tuple[int, int]


def _latent_test(is_latent: IsLatent, ids: Any, xp: Any) -> Any:
    if not callable(is_latent):
        offset, num = is_latent
        return (ids >= offset) & (ids < offset + num)
    try:
        out = xp.asarray(is_latent(ids), dtype=bool)
        if out.shape == ids.shape:
            return out
    except (TypeError, ValueError):
        pass
    if xp is not np:
        raise ValueError("is_latent must be vectorised (array in, bool array out) for JAX inputs")
    return np.vectorize(lambda i: bool(is_latent(int(i))), otypes=[bool])(ids)


def format_reward_batch(
    token_ids: Any,
    mask: Any = None,
    *,
    latent_start_id: int,
    latent_end_id: int,
    answer_start_id: int,
    answer_end_id: int,
    is_latent: IsLatent,
    min_latents: int = 0,
    latent_start_in_prompt: bool = False,
) -> Any:
    """R_fmt for a padded batch: ``token_ids [B, T]`` (generated tokens only), ``mask [B, T]`` (1 = real).

    A row scores 1.0 iff it holds exactly one ``<latent>`` and one ``</latent>``, exactly one
    ``<answer>`` and one ``</answer>``, in the order ``<latent> < </latent> < <answer> < </answer>``,
    every token strictly inside the latent span is a latent id (at least ``min_latents`` of them), and no
    latent id appears anywhere else. Text between the spans or after ``</answer>`` is allowed.
    ``is_latent`` is ``(latent_offset, num_latents)`` or a vectorised predicate on id arrays (a scalar
    predicate also works for NumPy input). Vectorised over tokens; NumPy in -> NumPy out, JAX in ->
    JAX out (jit-able with the tuple form). Returns ``[B]`` float32.
    """
    xp = np
    if type(token_ids).__module__.startswith(("jax", "jaxlib")):
        import jax.numpy as jnp

        xp = jnp
    ids = xp.asarray(token_ids)
    if ids.ndim != 2:
        raise ValueError(f"token_ids must be [B, T], got shape {tuple(ids.shape)}")
    valid = xp.ones(ids.shape, bool) if mask is None else xp.asarray(mask).astype(bool)
    if valid.shape != ids.shape:
        raise ValueError(f"mask shape {tuple(valid.shape)} != token_ids shape {tuple(ids.shape)}")

    def find(tok: int) -> tuple[Any, Any]:
        hit = (ids == tok) & valid
        return hit.sum(-1), xp.argmax(hit, axis=-1)

    n_ls, p_ls = find(latent_start_id)
    n_le, p_le = find(latent_end_id)
    n_as, p_as = find(answer_start_id)
    n_ae, p_ae = find(answer_end_id)
    if latent_start_in_prompt:
        ok = n_ls == 0
        p_ls = xp.full_like(p_ls, -1)
    else:
        ok = n_ls == 1
    ok = ok & (n_le == 1) & (n_as == 1) & (n_ae == 1) & (p_ls < p_le) & (p_le < p_as) & (p_as < p_ae)
    pos = xp.arange(ids.shape[1])[None, :]
    inside = (pos > p_ls[:, None]) & (pos < p_le[:, None])
    lat = _latent_test(is_latent, ids, xp) & valid
    ok = ok & ~xp.any(inside & valid & ~lat, axis=-1) & ~xp.any(lat & ~inside, axis=-1)
    ok = ok & ((lat & inside).sum(-1) >= min_latents)
    return ok.astype(xp.float32)


def format_reward(
    token_ids: Sequence[int] | np.ndarray,
    *,
    latent_start_id: int,
    latent_end_id: int,
    answer_start_id: int,
    answer_end_id: int,
    is_latent: IsLatent,
    min_latents: int = 0,
    latent_start_in_prompt: bool = False,
) -> float:
    """R_fmt of one generated sequence (unpadded); rules as :func:`format_reward_batch`."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(1, -1)
    return float(
        format_reward_batch(
            ids,
            None,
            latent_start_id=latent_start_id,
            latent_end_id=latent_end_id,
            answer_start_id=answer_start_id,
            answer_end_id=answer_end_id,
            is_latent=is_latent,
            min_latents=min_latents,
            latent_start_in_prompt=latent_start_in_prompt,
        )[0]
    )


def latent_ids_per_row(
    token_ids: np.ndarray, mask: np.ndarray | None, boundary: BoundaryIds
) -> list[np.ndarray]:
    """Codebook indices (``id - latent_offset``) of the latent tokens in each row's first latent span.

    The span runs from the first ``<latent>`` (or the row start when ``latent_start_in_prompt``) to the
    next ``</latent>`` or the end of the row's real tokens. Rows without a span give an empty array. Used
    for #L and by the process reward.
    """
    ids = np.asarray(token_ids)
    valid = np.ones(ids.shape, bool) if mask is None else np.asarray(mask).astype(bool)
    out = []
    for row, ok in zip(ids, valid, strict=True):
        row = row[ok]
        if boundary.latent_start_in_prompt:
            start = 0
        else:
            hits = np.flatnonzero(row == boundary.latent_start)
            if hits.size == 0:
                out.append(np.zeros((0,), np.int64))
                continue
            start = int(hits[0]) + 1
        ends = np.flatnonzero(row[start:] == boundary.latent_end)
        span = row[start : start + int(ends[0])] if ends.size else row[start:]
        lat = (span >= boundary.latent_offset) & (span < boundary.latent_offset + boundary.num_latents)
        out.append((span[lat] - boundary.latent_offset).astype(np.int64))
    return out


# --------------------------------------------------------------------------------------------- registry


@dataclass
class RewardInputs:
    """Everything a reward function may look at for one rollout batch (``B`` rollouts).

    ``completions``: decoded completion texts (latent tokens skipped); ``completion_ids`` /
    ``completion_mask``: the generated ids ``[B, T]`` and their padding mask; ``golds``: one gold answer
    per rollout; ``extras``: anything else a custom reward needs (models, tokenizers, questions).
    """

    completions: Sequence[str]
    golds: Sequence[str]
    benchmark: str
    completion_ids: np.ndarray | None = None
    completion_mask: np.ndarray | None = None
    boundary: BoundaryIds | None = None
    prompts: Sequence[str] | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)


RewardFn = Callable[[RewardInputs], np.ndarray]
_REWARDS: dict[str, RewardFn] = {}


def register_reward(name: str, *, overwrite: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Decorator: ``@register_reward("mine") def mine(inputs: RewardInputs) -> np.ndarray [B]``."""

    def deco(fn: RewardFn) -> RewardFn:
        if name in _REWARDS and not overwrite and _REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered; pass overwrite=True to replace it")
        _REWARDS[name] = fn
        return fn

    return deco


def get_reward(name: str) -> RewardFn:
    if name not in _REWARDS:
        raise ValueError(f"unknown reward {name!r}; registered: {', '.join(sorted(_REWARDS))}")
    return _REWARDS[name]


def list_rewards() -> tuple[str, ...]:
    return tuple(sorted(_REWARDS))


def combine_rewards(
    inputs: RewardInputs, weights: Mapping[str, float]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Weighted sum of registered rewards (e.g. ``{"answer": 1, "process": 0.25, "format": 0.1}``).

    Returns ``(total [B], {name: [B]})``; each reward must return ``B`` values.
    """
    b = len(inputs.completions)
    parts: dict[str, np.ndarray] = {}
    total = np.zeros((b,), np.float32)
    for name, w in weights.items():
        r = np.asarray(get_reward(name)(inputs), dtype=np.float32)
        if r.shape != (b,):
            raise ValueError(f"reward {name!r} returned shape {r.shape}, expected ({b},)")
        parts[name] = r
        total = total + np.float32(w) * r
    return total, parts


@register_reward("answer")
def _answer(inputs: RewardInputs) -> np.ndarray:
    return answer_reward(inputs.completions, inputs.golds, inputs.benchmark)


@register_reward("format")
def _format(inputs: RewardInputs) -> np.ndarray:
    if inputs.completion_ids is None or inputs.boundary is None:
        raise ValueError("the 'format' reward needs RewardInputs.completion_ids and RewardInputs.boundary")
    bd = inputs.boundary
    return format_reward_batch(
        inputs.completion_ids,
        inputs.completion_mask,
        latent_start_id=bd.latent_start,
        latent_end_id=bd.latent_end,
        answer_start_id=bd.answer_start,
        answer_end_id=bd.answer_end,
        is_latent=(bd.latent_offset, bd.num_latents),
        latent_start_in_prompt=bd.latent_start_in_prompt,
    )
