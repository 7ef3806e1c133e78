"""One latent-GRPO step (the paper's stage 3): what the rl stage (`stages/rl/stage.py`) runs once per RL
step, and what the `grpo_peers` benchmark times (`dlr_jax/bench/grpo_ours.py`).

`GRPOStep` has a method a phase, so each can be found and timed on its own:

1. **Rollouts.** P prompts (the stage's seeded, checkpointed `PromptStream`), each repeated G times (groups are
   adjacent), sampled at temperature T with the KV-cache `Sampler` on the *sampling* mesh
   (`rl.sample_mesh`, `rl.sample_dtype`: the policy's sampling copy, cast and resharded on device,
   `dlr_jax.generate.sampling_copy`). `</latent>` is forced after `rl.max_latents` latents; `rl.constrain_format`
   turns on the evaluation grammar. Generation stops at `</answer>` or `<eos>`.
2. **Rewards.** `R_ans + 0.25 r_proc + 0.1 R_fmt` (weights `rl.*_weight`) from the reward registry;
   r_proc (`dlr_jax.rewards.process`) needs the codebook stage's OCR decoder and is skipped, with a
   note, when its weight is 0 or no decoder exists (the stage decides); `rl.overlong=soft_penalty` adds
   DAPO's soft overlong penalty, `rl.overlong=mask` takes truncated rollouts out of the loss. With
   `rl.dynamic_sampling` (DAPO) groups whose rewards all agree are dropped and more prompts are rolled
   out, the same P x G shape each time, until P groups remain or the refills run out (`collect`).
3. **Old / reference log-probs.** The sampler's own log-probs are those of the policy at T; they are
   recomputed teacher-forced (`Sampler.score_states`: old policy and reference in one jitted pass,
   same T and vocab mask). With one optimizer step per rollout batch (mu = 1, one minibatch) the old
   policy *is* the updating one: that pass is skipped and the loss takes its own log-probs (ratio 1).
   The reference policy is the frozen SFT model (skipped when beta = 0). The sampler's log-probs ride
   in the batch: the first update reports their gap to the trainer's (`logprob_gap/*`: the sampling copy
   vs the trainer before either moved), and `rl.sampler_is_correction=truncated` weights the loss by them.
   Then group-normalised advantages.
4. **Updates.** mu = `rl.inner_epochs` shuffled passes over the rollouts in minibatches of
   `train.rl.batch_size`, each one `Trainer.train_step` with the clipped-ratio + k3-KL loss. The
   codebook is frozen (`filter_for_stage("rl")`); the OCR decoder and evaluator are separate models.

The stage builds one `GRPOStep` per run, feeds it each step's prompts and logs what it returns
(`stages.rl.METRICS`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from dlr_jax.config import Config
from dlr_jax.data.formats import parse_generation
from dlr_jax.generate.sampler import Sampler, left_pad
from dlr_jax.generate.sampling_copy import SamplingCopy
from dlr_jax.rewards.answer_format import BoundaryIds, RewardInputs, combine_rewards
from dlr_jax.stages.rl import grpo
from dlr_jax.training.trainer import Trainer, TrainingDiverged


@dataclasses.dataclass
class Rollouts:
    """One RL step's rollouts: the sampler's output (tokens, lengths, logprobs, finished) and the
    trainer's batch built from it, which the later phases complete (old/ref log-probs, advantages)."""

    out: Any
    batch: dict[str, np.ndarray]
    forced: float  # share of the generated tokens the latent grammar chose (no policy gradient there)


def assemble_rollouts(prompts: list[list[int]], tokens: np.ndarray, lengths: np.ndarray, prompt_len: int,
                      pad_id: int) -> dict[str, np.ndarray]:
    """`[left-padded prompt (prompt_len) ; completion (N)]` rows: tokens/attention_mask [B, S] int32,
    completion_mask [B, S] float32 (generated tokens, stop token included)."""
    ids, plens = left_pad(prompts, prompt_len, pad_id)
    n = tokens.shape[1]
    gen = (np.arange(n)[None, :] < lengths[:, None])
    real = np.arange(prompt_len)[None, :] >= (prompt_len - plens)[:, None]
    return {
        "tokens": np.concatenate([ids, np.where(gen, tokens, pad_id)], axis=1).astype(np.int32),
        "attention_mask": np.concatenate([real, gen], axis=1).astype(np.int32),
        "completion_mask": np.concatenate([np.zeros_like(real), gen], axis=1).astype(np.float32),
    }


def grpo_update(trainer: Trainer, batch: dict[str, np.ndarray], *, epochs: int, seed: int, step: int
                ) -> dict[str, float]:
    """`epochs` shuffled passes over the rollout batch in minibatches of `trainer.cfg.batch_size`
    rollouts, one `train_step` each; returns the mean of every trainer metric over the updates, and
    `ratio_first_update`. The `logprob_gap/*` entries are the first update's: the sampler's log-probs
    against the trainer's before any update (later updates add the policy's own drift)."""
    n = len(batch["tokens"])
    size = trainer.cfg.batch_size
    if n % size:
        raise ValueError(f"{n} rollouts do not split into minibatches of {size}")
    per_proc, pidx = size // jax.process_count(), jax.process_index()
    pending = []  # device metrics: one host sync after all updates, not one per update
    for epoch in range(epochs):
        perm = np.random.default_rng([seed, step, epoch]).permutation(n)
        for s in range(0, n, size):
            mb = perm[s : s + size][pidx * per_proc : (pidx + 1) * per_proc]
            pending.append(trainer.train_step_async({k: v[mb] for k, v in batch.items()}))
    sums: dict[str, list[float]] = defaultdict(list)
    for i, m in enumerate(jax.device_get(pending)):
        if not math.isfinite(float(m["loss"])):
            raise TrainingDiverged(f"[rl] non-finite loss ({float(m['loss'])}) at RL step {step}, update "
                                   f"{trainer.step - len(pending) + i + 1}; the last checkpoint is untouched")
        for k, v in m.items():
            sums[k].append(float(v))
    out = {k: float(np.mean(v)) for k, v in sums.items() if k != "weight"}
    # Before the first update the policy is the one that sampled: this ratio is 1 unless the trainer's
    # log-probs (training sharding) and the sampler's (sampling sharding) disagree.
    out["ratio_first_update"] = sums["ratio_mean"][0]
    out |= {k: v[0] for k, v in sums.items() if k.startswith("logprob_gap/")}
    return out


def take_rows(parts: list[Any], rows: list[tuple[int, int]]) -> Any:
    """Rows `(part, row)` of same-structured parts (arrays, lists, dicts or dataclasses of them, with rows
    first) stacked in that order: the batch one step trains on, gathered from several rollout calls."""
    first = parts[0]
    if isinstance(first, np.ndarray):
        return np.stack([parts[p][r] for p, r in rows])
    if isinstance(first, list):
        return [parts[p][r] for p, r in rows]
    if isinstance(first, dict):
        return {k: take_rows([x[k] for x in parts], rows) for k in first}
    if dataclasses.is_dataclass(first):
        return dataclasses.replace(first, **{f.name: take_rows([getattr(x, f.name) for x in parts], rows)
                                            for f in dataclasses.fields(first)})
    raise TypeError(f"cannot take rows of a {type(first).__name__}")


@dataclasses.dataclass
class Collected:
    """What `GRPOStep.collect` returns: the P x G rollouts the step trains on (`ro`, with `parsed`,
    `reward`, `parts` of those rows), and the step's measures over every rollout it generated (the
    policy's reward, lengths, zero-variance groups; `dynamic/*` with dynamic sampling)."""

    ro: Rollouts
    parsed: list[Any]
    reward: np.ndarray
    parts: dict[str, np.ndarray]
    metrics: dict[str, float]


class GRPOStep:
    """One latent-GRPO step (the paper's stage 3) as named phases, each a method a reader finds and
    a benchmark can time:

        rollout -> score -> rewards -> advantages -> update

    `__call__` runs them in that order on one step's prompts and returns the step's metrics (the
    `time/*` entries time the phases). Built once per run: it holds the sampler with the policy's
    sampling copy, the reference weights, the reward setup and the trainer.
    """

    def __init__(self, cfg: Config, tok: Any, trainer: Trainer, sampler: Sampler, copy: SamplingCopy, *,
                 prompt_len: int, vocab_mask: Any, ref_state: Any, weights: dict[str, float],
                 extras: dict[str, Any]):
        rl = cfg.rl
        self.rl, self.seed, self.benchmark = rl, cfg.run.seed, cfg.data.dataset
        self.tok, self.trainer, self.sampler, self.copy = tok, trainer, sampler, copy
        self.prompt_len, self.vocab_mask, self.ref_state = prompt_len, vocab_mask, ref_state
        self.weights, self.extras = weights, extras
        # One optimizer step per rollout batch (mu = 1, one minibatch): the policy that updates is the
        # one that sampled, so the old-policy pass is skipped (`score`; the loss uses its own log-probs).
        self.old_pass = rl.inner_epochs * rl.num_prompts * rl.group_size // trainer.cfg.batch_size > 1
        self.processor, self.aux = None, None
        if rl.max_latents or rl.constrain_format:
            from dlr_jax.generate.latent_grammar import latent_phase_processor, latent_processor_aux

            self.processor = latent_phase_processor
            self.aux = latent_processor_aux(tok, limit=rl.max_latents or rl.max_new_tokens,
                                            constrain=rl.constrain_format)
        self.boundary = BoundaryIds(tok.latent_start_id, tok.latent_end_id, tok.answer_start_id, tok.answer_end_id,
                                    tok.latent_offset, tok.num_latents)
        self.generate = functools.partial(
            sampler.generate, max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_k=rl.top_k,
            top_p=rl.top_p, stop_ids=[tok.answer_end_id, tok.eos_id], pad_id=tok.pad_id,
            logits_processor=self.processor, processor_aux=self.aux, vocab_mask=vocab_mask,
        )

    def rollout(self, rows: list[list[int]], step: int, call: int = 0) -> Rollouts:
        """Samples one completion per row (prompt repeated G times per group) with the step's key (the
        `call`-th rollout call of the step: dynamic sampling's refills are calls 1, 2, ...), and lays
        prompts and completions out as the trainer's batch."""
        key = jax.random.fold_in(jax.random.key(self.seed), step)
        out = self.generate(rows, rng=key if call == 0 else jax.random.fold_in(key, call))
        batch = assemble_rollouts(rows, out.tokens, out.lengths, self.prompt_len, self.tok.pad_id)
        forced = 0.0
        if self.processor is not None:  # tokens the grammar chose carry no policy gradient
            from dlr_jax.generate.latent_grammar import forced_tokens

            hit = np.asarray(forced_tokens(out.tokens, out.lengths, self.aux, self.vocab_mask))
            batch["completion_mask"][:, self.prompt_len:] *= ~hit
            forced = float(hit.sum() / max(out.lengths.sum(), 1))
        if self.rl.overlong == "mask":  # DAPO's overlong filtering: a cut-off rollout teaches nothing
            batch["completion_mask"] *= out.finished[:, None]
        return Rollouts(out, batch, forced)

    def collect(self, rows: list[list[int]], group: list[Any], step: int,
                refill: Callable[[], tuple[list[list[int]], list[Any]]] | None = None) -> Collected:
        """Rollouts and rewards of one step. Without `rl.dynamic_sampling` (or `refill`) the rows' own.
        With it (DAPO), groups whose rewards span at most `rl.dynamic_sampling_tol` are dropped and
        `refill()` (the prompt stream's next P prompts, G rows each) is rolled out, at most
        `rl.dynamic_sampling_max_refills` times, until P groups with a spread remain; they are taken in the
        order they were generated, surplus ones discarded, and a batch still short is topped up with
        dropped groups. Every call has the shape of the first: the compiled programs are reused."""
        rl, g = self.rl, self.rl.group_size
        dynamic = rl.dynamic_sampling and refill is not None
        calls = []  # (rollouts, parsed, reward, parts) of each rollout call
        flat: list[np.ndarray] = []  # each call's zero-variance groups
        t_rollout = t_rewards = 0.0
        while True:
            t0 = time.perf_counter()
            ro = self.rollout(rows, step, call=len(calls))
            t1 = time.perf_counter()
            calls.append((ro, *self.rewards(ro.out, group)))
            t_rollout, t_rewards = t_rollout + t1 - t0, t_rewards + time.perf_counter() - t1
            if not dynamic:
                break
            flat.append(np.asarray(grpo.zero_variance_groups(calls[-1][2], g, rl.dynamic_sampling_tol)))
            if sum(int((~f).sum()) for f in flat) * g >= len(rows) or len(calls) > rl.dynamic_sampling_max_refills:
                break
            rows, group = refill()
        outs = [c[0].out for c in calls]
        reward_all = np.concatenate([c[2] for c in calls])
        parts_all = {k: np.concatenate([c[3][k] for c in calls]) for k in calls[0][3]}
        lengths = np.concatenate([o.lengths for o in outs])
        n_latents = [p.n_latents for c in calls for p in c[1]]
        metrics = {
            "reward": float(reward_all.mean()), "reward_std": float(reward_all.std()),
            "forced_fraction": float(sum(c[0].forced * c[0].out.lengths.sum() for c in calls) / max(lengths.sum(), 1)),
            **{f"reward/{k}": float(v.mean()) for k, v in parts_all.items()},
            "accuracy": float(parts_all["answer"].mean()),
            "n_latents": float(np.mean(n_latents)),
            "completion_length": float(lengths.mean()),
            "finished": float(np.concatenate([o.finished for o in outs]).mean()),
            "zero_std_frac": float(grpo.zero_std_fraction(reward_all, g)),
            "time/rollout": t_rollout, "time/rewards": t_rewards,
        }
        if rl.overlong == "mask":
            metrics["overlong/masked"] = 1.0 - metrics["finished"]
        if not dynamic:
            return Collected(calls[0][0], calls[0][1], calls[0][2], calls[0][3], metrics)
        # which groups the step trains on: those with a spread first, in generation order, then dropped ones
        n_groups = len(calls[0][2]) // g
        spread = [(i, j) for i, f in enumerate(flat) for j in range(n_groups) if not f[j]]
        dropped = [(i, j) for i, f in enumerate(flat) for j in range(n_groups) if f[j]]
        chosen = (spread + dropped)[:n_groups]
        rows_of = [(i, j * g + r) for i, j in chosen for r in range(g)]
        metrics |= {
            "dynamic/refills": float(len(calls) - 1), "dynamic/rollouts": float(len(reward_all)),
            "dynamic/groups_dropped": float(len(dropped)),
            "dynamic/groups_topped_up": float(max(n_groups - len(spread), 0)),
            "dynamic/groups_discarded": float(max(len(spread) - n_groups, 0)),
        }
        ro = Rollouts(take_rows(outs, rows_of), take_rows([c[0].batch for c in calls], rows_of),
                      metrics["forced_fraction"])
        return Collected(ro, take_rows([c[1] for c in calls], rows_of), take_rows([c[2] for c in calls], rows_of),
                         take_rows([c[3] for c in calls], rows_of), metrics)

    def score(self, ro: Rollouts) -> None:
        """Teacher-forced old-policy (with an old-policy pass, `old_pass`) and reference (beta != 0)
        log-probs into the batch, and the sampler's own log-probs (`sampler_logps`: the update measures
        the sampler/trainer gap with them, and the truncated IS correction weights by them)."""
        batch, score = ro.batch, dict(temperature=self.rl.temperature, vocab_mask=self.vocab_mask)
        cmask = batch["completion_mask"]
        # old policy and reference in one jitted pass (whichever of them this step needs)
        states = [self.sampler.state] * self.old_pass + [self.ref_state] * (self.ref_state is not None)
        scored = self.sampler.score_states(states, batch["tokens"], batch["attention_mask"], **score) if states else []
        if self.old_pass:
            batch["old_logps"] = scored[0] * cmask
        sampled = np.zeros_like(cmask)
        sampled[:, self.prompt_len:] = ro.out.logprobs
        batch["sampler_logps"] = sampled * cmask
        if self.ref_state is not None:
            batch["ref_logps"] = scored[-1] * cmask

    def rewards(self, out: Any, group: list[Any]) -> tuple[list[Any], np.ndarray, dict[str, np.ndarray]]:
        """(parsed completions, reward [rows], {component: [rows]}) of a sampler output whose rows
        answer `group`'s examples."""
        tok = self.tok
        parsed = [parse_generation(tok, out.tokens[r, : out.lengths[r]]) for r in range(len(group))]
        gen_mask = (np.arange(out.tokens.shape[1])[None, :] < out.lengths[:, None]).astype(np.float32)
        inputs = RewardInputs(
            completions=[p.text for p in parsed], golds=[ex.answer for ex in group],
            benchmark=self.benchmark, completion_ids=out.tokens, completion_mask=gen_mask,
            boundary=self.boundary, prompts=[ex.question for ex in group], extras=self.extras,
        )
        reward, parts = combine_rewards(inputs, self.weights)
        if self.rl.overlong == "soft_penalty":  # DAPO's soft overlong punishment, on top of the task reward
            max_len = self.rl.max_new_tokens
            buffer = self.rl.overlong_buffer or max(max_len // 5, 1)
            parts["overlong"] = np.asarray(grpo.soft_overlong_penalty(out.lengths, max_len, buffer))
            reward = reward + parts["overlong"]
        return parsed, reward, parts

    def advantages(self, reward: np.ndarray) -> np.ndarray:
        """Group-normalised advantages (groups are adjacent rows)."""
        return np.asarray(grpo.group_advantages(reward, self.rl.group_size, self.rl.scale_rewards))

    def update(self, batch: dict[str, np.ndarray], step: int) -> dict[str, float]:
        """rl.inner_epochs passes of optimizer steps over the rollouts, then the new policy's sampling
        copy made on device (cast, then resharded onto the sampling mesh)."""
        upd = grpo_update(self.trainer, batch, epochs=self.rl.inner_epochs, seed=self.seed, step=step)
        t = self.trainer
        self.sampler.set_state(self.copy(nnx.state(nnx.merge(t.graphdef, t.params, t.rest))))
        return upd

    def __call__(self, rows: list[list[int]], group: list[Any], step: int,
                 refill: Callable[[], tuple[list[list[int]], list[Any]]] | None = None) -> dict[str, float]:
        """Every phase on one step's rows (and, with dynamic sampling, `refill`'s); the step's metrics
        (`stages.rl.METRICS`). Reward, length and latent measures are over every rollout generated."""
        t0 = time.perf_counter()
        col = self.collect(rows, group, step, refill)
        t1 = time.perf_counter()
        self.score(col.ro)
        t2 = time.perf_counter()
        col.ro.batch["advantages"] = self.advantages(col.reward)
        t3 = time.perf_counter()
        upd = self.update(col.ro.batch, step)
        t4 = time.perf_counter()
        timing = {k: col.metrics.pop(k) for k in ("time/rollout", "time/rewards")}
        return {
            "updates": self.trainer.step, **col.metrics,
            **{k: v for k, v in upd.items() if k not in ("clip_ratio/region_mean", "batch_hash")},
            "clip_fraction": upd["clip_ratio/region_mean"],
            "time/rollout": timing["time/rollout"], "time/score": t2 - t1,
            "time/rewards": timing["time/rewards"] + t3 - t2, "time/update": t4 - t3, "time/step": t4 - t0,
        }
