"""Held-out reward curve of the RL stage: the policy's mean reward on a fixed set of prompts.

The training reward of an RL step is measured on that step's P prompts; with P = 16 its noise
(problem difficulty varies) hides a change of a few points. This evaluation samples the same
`rl.eval_prompts` prompts (`rl.eval_split`: data.eval_split by default, or "pool" = the RL
training problems of `rl.prompt_pool`), `rl.eval_samples` times each, at the rollout
temperature, with the same random numbers every time (common random numbers: a difference between
two evaluations is the policy's, not the sampler's), and scores them with the training reward. It
runs before the first RL step (step 0), every `rl.eval_every` steps and after the last one, and
adds `eval/reward`, `eval/accuracy` and `eval/reward/<component>` rows to `rl/metrics.jsonl`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.config import Config
from dlr_jax.data.formats import prompt_ids
from dlr_jax.data.sources import load_examples
from dlr_jax.text.tokens import Tokenizer

# (prompt rows, their examples, chunk index) -> (reward [rows], {component: [rows]})
ScoreFn = Callable[[list[list[int]], list[Any], int], tuple[np.ndarray, dict[str, np.ndarray]]]


def reward_curve(metrics_path: Any) -> list[tuple[int, float, float]]:
    """[(RL step, eval/reward, eval/accuracy)] from a run's rl/metrics.jsonl (empty without eval rows).
    A resumed run may repeat a step; the last row of each step wins."""
    curve: dict[int, tuple[float, float]] = {}
    p = Path(metrics_path)
    for line in (p.read_text().splitlines() if p.is_file() else []):
        m = json.loads(line)
        if "eval/reward" in m:
            curve[int(m["step"])] = (float(m["eval/reward"]), float(m.get("eval/accuracy", float("nan"))))
    return [(k, *v) for k, v in sorted(curve.items())]


def eval_rows(prompts: Sequence[list[int]], examples: Sequence[Any], samples: int, chunk: int
              ) -> list[tuple[list[list[int]], list[Any], int]]:
    """Each prompt repeated `samples` times, cut into chunks of exactly `chunk` rows (the compiled
    rollout shape); the last chunk is filled with repeats of its first row, and the third element of
    each chunk says how many of its rows are real."""
    if samples < 1 or chunk < 1:
        raise ValueError(f"need samples >= 1 and chunk >= 1, got samples={samples}, chunk={chunk}")
    rows = [(p, ex) for p, ex in zip(prompts, examples, strict=True) for _ in range(samples)]
    out = []
    for s in range(0, len(rows), chunk):
        part = rows[s : s + chunk]
        real = len(part)
        part = part + [part[0]] * (chunk - real)
        out.append(([p for p, _ in part], [ex for _, ex in part], real))
    return out


def held_out_reward(score: ScoreFn, chunks: list[tuple[list[list[int]], list[Any], int]]) -> dict[str, float]:
    """Mean reward and components over the real rows of `chunks` (from `eval_rows`)."""
    rewards, parts = [], {}
    for i, (rows, exs, real) in enumerate(chunks):
        r, p = score(rows, exs, i)
        rewards.append(np.asarray(r)[:real])
        for k, v in p.items():
            parts.setdefault(k, []).append(np.asarray(v)[:real])
    if not rewards:
        return {}
    out = {"eval/reward": float(np.concatenate(rewards).mean())}
    out |= {f"eval/reward/{k}": float(np.concatenate(v).mean()) for k, v in parts.items()}
    if "eval/reward/answer" in out:
        out["eval/accuracy"] = out["eval/reward/answer"]
    out["eval/rollouts"] = float(sum(len(r) for r in rewards))
    return out


def held_out_evaluator(cfg: Config, tok: Tokenizer, room: int, chunk: int, score: Any, pool: Any = ()):
    """None when rl.eval_prompts = 0; else a function returning the held-out reward metrics
    (`rl_eval.held_out_reward`) of the current policy on the first rl.eval_prompts prompts of
    rl.eval_split (default data.eval_split; "pool" = `pool`, the RL training problems) that fit in
    `room` tokens. `score(rows, examples, chunk)` samples and scores one chunk of `chunk` rows."""
    if cfg.rl.eval_prompts <= 0:
        return None
    split = cfg.rl.eval_split or cfg.data.eval_split
    exs = list(pool) if split == "pool" else load_examples(cfg, split)
    pairs = [(p, ex) for ex in exs if len(p := prompt_ids(tok, ex.question)) <= room][: cfg.rl.eval_prompts]
    if not pairs:
        raise ValueError(f"rl.eval_prompts: no {split!r} prompt fits in {room} tokens")
    chunks = eval_rows([p for p, _ in pairs], [ex for _, ex in pairs], cfg.rl.eval_samples, chunk)
    return lambda: held_out_reward(score, chunks)
