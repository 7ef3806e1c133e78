"""Held-out reward curve of the RL stage: the policy's mean reward on a fixed set of prompts.

The training reward of an RL step is measured on that step's P prompts; with P = 16 its noise
(problem difficulty varies) hides a change of a few points. This evaluation samples the same
`rl.eval_prompts` prompts (`rl.eval_split`: data.eval_split by default, or "pool" = the RL
training problems of `rl.prompt_pool`), `rl.eval_samples` times each, at the rollout
temperature (or `rl.eval_temperature`; 0 = greedy, the tables' Pass@1), with the same random
numbers every time (common random numbers: a difference between two evaluations is the policy's,
not the sampler's), and scores them with the training reward. It
runs before the first RL step (step 0), every `rl.eval_every` steps and after the last one, and
adds `eval/reward`, `eval/accuracy` and `eval/reward/<component>` rows to `rl/metrics.jsonl` (and
TensorBoard).

With n = `rl.eval_samples` rollouts of each prompt it also reports, for every k of `rl.eval_k`
(default: 1 and n), `eval/pass@k` — the unbiased estimator 1 - C(n-c, k) / C(n, k) of Chen et al.
(2021) with c of the n correct, averaged over prompts — and, for k > 1, `eval/maj@k`: the majority
vote of k rollouts' extracted answers (answers that `is_correct` equates vote together; ties go to
the answer seen first) is right, averaged over the n // k disjoint blocks of k rollouts of each
prompt (each block is k independent samples, so the mean is unbiased with less noise than one vote).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from dlr_jax.config import Config
from dlr_jax.data.formats import prompt_ids
from dlr_jax.data.sources import load_examples
from dlr_jax.text.answers import is_correct
from dlr_jax.text.tokens import Tokenizer

# (prompt rows, their examples, chunk index) -> (reward [rows], {component: [rows]}[, extracted answers [rows]])
ScoreFn = Callable[[list[list[int]], list[Any], int], tuple]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n - c, k) / C(n, k) (Chen et al.,
    2021), the chance that k of the n drawn without replacement hold a correct one. Exact (rationals)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def majority_answer(answers: Sequence[str | None], same: Callable[[str, str], bool]) -> str | None:
    """The answer most of `answers` give, answers for which `same(a, first)` holds counting as one
    (None, no answer, does not vote); ties go to the answer seen first; None when none answered."""
    votes: list[list[Any]] = []  # [first answer of the cluster, count]
    for a in answers:
        if a is None:
            continue
        for v in votes:
            if same(a, v[0]):
                v[1] += 1
                break
        else:
            votes.append([a, 1])
    return max(votes, key=lambda v: v[1])[0] if votes else None  # max keeps the first of equal counts


def maj_at_k(answers: Sequence[str | None], k: int, correct: Callable[[str | None], bool],
             same: Callable[[str, str], bool]) -> float:
    """maj@k of one prompt's n sampled answers: the share of its n // k disjoint blocks of k (in sample
    order) whose majority answer (`majority_answer`) is `correct`."""
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    blocks = [answers[s : s + k] for s in range(0, n - k + 1, k)]
    return float(np.mean([correct(majority_answer(b, same)) for b in blocks]))


def answers_match(benchmark: str) -> Callable[[str, str], bool]:
    """Whether two extracted answers are the same answer for majority voting: the same text, or
    `is_correct` with one of them as the gold (an answer no checker can take as a gold, e.g. a word on a
    numeric benchmark, matches its own text only)."""

    def same(a: str, b: str) -> bool:
        if a.strip() == b.strip():
            return True
        try:
            return is_correct(a, b, benchmark)
        except ValueError:
            return False

    return same


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


def held_out_reward(score: ScoreFn, chunks: list[tuple[list[list[int]], list[Any], int]], *, samples: int = 1,
                    ks: Sequence[int] = (), benchmark: str | None = None) -> dict[str, float]:
    """Mean reward and components over the real rows of `chunks` (from `eval_rows` with `samples` rows a
    prompt); with `ks`, `eval/pass@k` from the answer reward (1 = correct) and, where `score` also returns
    the extracted answers, `eval/maj@k` (k > 1) judged by `is_correct` on `benchmark`."""
    rewards, parts, answers, golds = [], {}, [], []
    for i, (rows, exs, real) in enumerate(chunks):
        r, p, *ans = score(rows, exs, i)
        rewards.append(np.asarray(r)[:real])
        for k, v in p.items():
            parts.setdefault(k, []).append(np.asarray(v)[:real])
        if ans:
            answers += list(ans[0])[:real]
        golds += [getattr(ex, "answer", None) for ex in exs[:real]]
    if not rewards:
        return {}
    out = {"eval/reward": float(np.concatenate(rewards).mean())}
    out |= {f"eval/reward/{k}": float(np.concatenate(v).mean()) for k, v in parts.items()}
    if "eval/reward/answer" in out:
        out["eval/accuracy"] = out["eval/reward/answer"]
        ok = np.concatenate(parts["answer"]).reshape(-1, samples) > 0.5
        for k in ks:
            out[f"eval/pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in ok.sum(1)]))
        if answers and benchmark is not None:
            same = answers_match(benchmark)
            for k in (k for k in ks if k > 1):
                per = [maj_at_k(answers[s : s + samples], k, lambda a, g=golds[s]: is_correct(a, g, benchmark), same)
                       for s in range(0, len(answers), samples)]
                out[f"eval/maj@{k}"] = float(np.mean(per))
    out["eval/rollouts"] = float(sum(len(r) for r in rewards))
    return out


def eval_ks(ks: Sequence[int], samples: int) -> tuple[int, ...]:
    """`rl.eval_k` resolved: () = (1, samples); every k must be in 1..samples."""
    ks = tuple(sorted({int(k) for k in ks})) if ks else tuple(sorted({1, samples}))
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise ValueError(f"rl.eval_k={list(ks)}: every k must be between 1 and rl.eval_samples={samples}, got {bad}")
    return ks


def held_out_evaluator(cfg: Config, tok: Tokenizer, room: int, chunk: int, score: Any, pool: Any = ()):
    """None when rl.eval_prompts = 0; else a function returning the held-out reward metrics
    (`held_out_reward`, pass@k and maj@k included) of the current policy on the first rl.eval_prompts prompts of
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
    ks = eval_ks(cfg.rl.eval_k, cfg.rl.eval_samples)
    return lambda: held_out_reward(score, chunks, samples=cfg.rl.eval_samples, ks=ks, benchmark=cfg.data.dataset)
