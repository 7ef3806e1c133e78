"""Stage 3 — latent GRPO (the paper's RL stage): the SFT model samples latent reasoning + answers and is
pushed toward rewarded ones. Defaults (`RLConfig`) are the paper's settings.

One RL step is a `GRPOStep` (step.py, which describes each phase): rollouts of P prompts x G,
old / reference log-probs, rewards, group-normalised advantages, mu passes of updates. This file
builds what the step holds: the trainer (codebook frozen, `filter_for_stage("rl")`), the policy's
sampling copy, the reference (the frozen SFT model, none when beta = 0) and the process reward's OCR
decoder and evaluator (r_proc is skipped, with a note, when its weight is 0 or no decoder exists). A codebook
that rendered one step a canvas (codebook.render_unit=step) has its decoder read a generated span one step at a
time, which needs a fixed canvas (`process_step_codes`).

Prompts come from data.train_split (or its first `rl.prompt_pool` problems). With `rl.eval_prompts`
> 0 the policy's reward on a fixed prompt set (data.eval_split, or the pool) is measured before step 1
and every `rl.eval_every` steps with fixed random numbers (`eval.py`): a low-noise reward curve, with
pass@k and maj@k (`rl.eval_k`).

What the field added to GRPO is opt-in, each default the paper's (RLConfig documents them): GSPO's
sequence-level ratio, the truncated IS correction of the sampler/trainer mismatch (whose gap is logged
every step), overlong masking or DAPO's soft penalty, and DAPO's dynamic sampling, which refills a step's
batch from the prompt stream (`PromptStream.draw`) in calls of the same shape.

Checkpoints hold the trainer state plus the prompt stream (which also counts RL steps, and covers the
prompts a step's refills drew), so rerunning the command continues where an uninterrupted run would.
Metrics per RL step go to `<workdir>/rl/metrics.jsonl` (see `METRICS`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dlr_jax.config import Config, ConfigError
from dlr_jax.core import preemption
from dlr_jax.core.metrics_log import MetricsWriter, ProfileWindow, drop_rows
from dlr_jax.data.formats import prompt_ids
from dlr_jax.data.latents import fixed_step_codes
from dlr_jax.data.sources import load_examples
from dlr_jax.generate.sampler import Sampler
from dlr_jax.generate.sampling_copy import SamplingCopy, copy_dtype, sample_mesh_for
from dlr_jax.rewards.answer_format import KNOWN_BENCHMARKS, extract_answer
from dlr_jax.rewards.process import LatentDecoder, ProcessReward
from dlr_jax.run.handoff import save_stage_model
from dlr_jax.run.workdir import stage_dir
from dlr_jax.stages import common
from dlr_jax.stages.codebook.models import load_latent_decoder
from dlr_jax.stages.latent_common import load_latent_stage
from dlr_jax.stages.rl import grpo
from dlr_jax.stages.rl.eval import eval_ks, held_out_evaluator
from dlr_jax.stages.rl.loss import make_grpo_loss
from dlr_jax.stages.rl.models import extra_reward_weights, load_evaluator
from dlr_jax.stages.rl.step import GRPOStep
from dlr_jax.training.trainer import Trainer

METRICS = (
    "step", "updates", "reward", "reward_std", "reward/answer", "reward/format", "accuracy", "n_latents",
    "completion_length", "finished", "zero_std_frac", "loss", "policy_loss", "kl", "clip_fraction",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "ratio_mean", "ratio_first_update", "entropy", "grad_norm", "lr",
    "logprob_gap/mean", "logprob_gap/max", "logprob_gap/kl", "time/rollout", "time/score", "time/rewards",
    "time/update", "time/step",
)  # plus "reward/process" when r_proc runs; "kl" only when beta > 0; "sampler_is/mean" and "sampler_is/capped"
# with rl.sampler_is_correction=truncated; "reward/overlong" with rl.overlong=soft_penalty, "overlong/masked" with
# mask; with rl.dynamic_sampling, DYNAMIC_METRICS
DYNAMIC_METRICS = ("dynamic/refills", "dynamic/rollouts", "dynamic/groups_dropped", "dynamic/groups_topped_up",
                   "dynamic/groups_discarded")


@dataclasses.dataclass
class RLResult:
    model: nnx.Module
    step: int
    preempted: bool
    history: list[dict[str, float]]  # one row per RL step
    evals: list[dict[str, float]] = dataclasses.field(default_factory=list)  # rl.eval_* rows (rl_eval.py)


# ----------------------------------------------------------------------------------------------
# Prompts and config checks.


class PromptStream:
    """Seeded epochs of shuffled prompt indices, `batch` at a time; `get_state`/`set_state` make it
    checkpointable (the trainer saves it). `steps` counts batches drawn = RL steps taken."""

    def __init__(self, n: int, batch: int, seed: int):
        if n < 1 or batch < 1:
            raise ValueError(f"need at least one prompt and batch >= 1, got n={n}, batch={batch}")
        self.n, self.batch, self.seed = n, batch, seed
        self.epoch, self.pos, self.steps = 0, 0, 0
        # The held-out evaluation of step `steps` was due and had not finished when this state was saved (a
        # checkpoint is written before its step's evaluation, a stop without it): a resumed run evaluates first.
        self.eval_pending = False

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    def __next__(self) -> np.ndarray:
        """The next RL step's prompts (counts a step)."""
        out = self.draw()
        self.steps += 1
        return out

    def draw(self) -> np.ndarray:
        """The next `batch` prompts without counting a step: dynamic sampling's refills within a step."""
        out: list[int] = []
        while len(out) < self.batch:
            order = self._order()
            take = order[self.pos : self.pos + self.batch - len(out)]
            out += take.tolist()
            self.pos += len(take)
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return np.asarray(out, np.int64)

    def get_state(self) -> dict[str, int]:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "pos": self.pos, "steps": self.steps,
                "eval_pending": int(self.eval_pending)}

    def set_state(self, state: dict[str, int]) -> None:
        if int(state["n"]) != self.n or int(state["seed"]) != self.seed:
            raise ValueError(f"checkpointed prompt stream has n={state['n']}, seed={state['seed']}; this run "
                             f"has n={self.n}, seed={self.seed} (different data or seed)")
        self.epoch, self.pos, self.steps = int(state["epoch"]), int(state["pos"]), int(state["steps"])
        self.eval_pending = bool(int(state.get("eval_pending", 0)))  # checkpoints from before the key: none


def _check(cfg: Config) -> None:
    rl, t = cfg.rl, cfg.train.rl
    b = rl.num_prompts * rl.group_size
    problems = []
    if rl.group_size < 2:
        problems.append(f"rl.group_size={rl.group_size} must be >= 2 (advantages are relative to the group)")
    if b % t.batch_size:
        problems.append(f"rl.num_prompts * rl.group_size = {b} must be divisible by train.rl.batch_size="
                        f"{t.batch_size}")
    if rl.temperature <= 0:
        problems.append(f"rl.temperature={rl.temperature} must be > 0 (GRPO samples)")
    if rl.inner_epochs < 1:
        problems.append(f"rl.inner_epochs={rl.inner_epochs} must be >= 1")
    if rl.max_latents and rl.max_new_tokens < rl.max_latents + 5:
        problems.append(f"rl.max_new_tokens={rl.max_new_tokens} leaves no room for an answer after "
                        f"rl.max_latents={rl.max_latents} latents (need >= max_latents + 5)")
    if rl.scale_rewards not in grpo.SCALE_MODES:
        problems.append(f"rl.scale_rewards must be one of {grpo.SCALE_MODES}, got {rl.scale_rewards!r}")
    if rl.eval_temperature is not None and rl.eval_temperature < 0:
        problems.append(f"rl.eval_temperature={rl.eval_temperature} must be >= 0 (0 = greedy)")
    if rl.eval_temperature == 0 and rl.eval_samples != 1:
        problems.append(f"rl.eval_temperature=0 (greedy) makes the rl.eval_samples={rl.eval_samples} rollouts of a "
                        "prompt identical: set rl.eval_samples=1")
    if rl.eval_prompts:
        try:
            eval_ks(rl.eval_k, rl.eval_samples)
        except ValueError as e:
            problems.append(str(e))
    if cfg.data.dataset not in KNOWN_BENCHMARKS:
        problems.append(f"data.dataset={cfg.data.dataset!r} has no answer checker; known: {KNOWN_BENCHMARKS}")
    if problems:
        raise ValueError("stage rl: " + "; ".join(problems))


def process_step_codes(cfg: Config) -> int | None:
    """The codes per step the process reward cuts a generated span into (`ProcessReward.step_codes`): None for a
    whole-chain codebook (codebook.render_unit=chain), c = (side / 64)^2 for a step codebook on a fixed canvas.
    A step codebook whose canvas is not fixed is a ConfigError: its decoder reads one step's codes, and a
    generated span does not say where one step's codes end."""
    cb = cfg.codebook
    if cb.render_unit != "step":
        return None
    per = fixed_step_codes(cb)
    if per is None:
        raise ConfigError(
            f"stage rl: the process reward (rl.process_weight={cfg.rl.process_weight}) decodes generated latents one "
            f"step at a time under codebook.render_unit=step, which needs the same codes for every step: set "
            f"codebook.min_side = codebook.max_side (now {cb.min_side} and {cb.max_side}; the codebook and export "
            "stages must use that canvas too), or rl.process_weight=0")
    return per


# ----------------------------------------------------------------------------------------------
# The stage.


def run(
    cfg: Config, workdir: str | Path, *, num_steps: int | None = None, latent_decoder: LatentDecoder | None = None
) -> RLResult:
    """Runs (or resumes) latent GRPO from `<workdir>/sft/final` for `num_steps` RL steps (default
    `train.rl.num_steps`); writes `<workdir>/rl/{checkpoints,metrics.jsonl,final}`. `latent_decoder`
    overrides the codebook stage's OCR decoder for r_proc."""
    from dlr_jax.models.latent_lm import filter_for_stage

    _check(cfg)
    rl, tcfg = cfg.rl, cfg.train.rl
    # the same condition as the decoder's loading below: refused before anything is loaded or written
    uses_decoder = rl.process_weight != 0 and (latent_decoder is not None or cfg.latent.source == "codebook")
    step_codes = process_step_codes(cfg) if uses_decoder else None
    examples = load_examples(cfg, cfg.data.train_split)  # the inputs validate before anything is written
    common.prepare_workdir(cfg, workdir, examples)
    tok = common.get_tokenizer(cfg, workdir, examples)
    examples = common.stage_examples(cfg, workdir, "rl", tok, examples)
    if rl.prompt_pool > 0:
        examples = examples[: rl.prompt_pool]
    tcfg = common.resolve_schedule(tcfg, len(examples), workdir, "rl", per_step=rl.num_prompts)
    total = num_steps or tcfg.num_steps
    train_mesh = common.make_mesh_for(cfg)
    rules = cfg.mesh.rules

    prompts = [prompt_ids(tok, ex.question) for ex in examples]
    room = rl.max_prompt_tokens or cfg.data.max_len - rl.max_new_tokens
    keep = [i for i, p in enumerate(prompts) if len(p) <= room]
    if not keep:
        raise ValueError(f"no training prompt fits data.max_len={cfg.data.max_len} - rl.max_new_tokens="
                         f"{rl.max_new_tokens} tokens")
    if len(keep) < len(prompts):
        print(f"[rl] {len(prompts) - len(keep)} of {len(prompts)} prompts are longer than {room} tokens: "
              "left out", flush=True)
    examples, prompts = [examples[i] for i in keep], [prompts[i] for i in keep]
    bucket = cfg.sampling.prompt_bucket
    prompt_len = -(-max(map(len, prompts)) // bucket) * bucket  # fixed: one compiled shape per run

    model = load_latent_stage(cfg, workdir, "sft", tok, train_mesh)
    vocab_mask = model.vocab_mask()
    smesh = sample_mesh_for(rl.sample_mesh, train_mesh, model.backbone.cfg, model.latent_cfg.total_vocab_size)
    p_g = rl.num_prompts * rl.group_size
    updates_per_step = rl.inner_epochs * p_g // tcfg.batch_size
    loss_fn = make_grpo_loss(
        temperature=rl.temperature, vocab_mask=vocab_mask, epsilon=rl.epsilon, epsilon_high=rl.epsilon_high,
        beta=rl.beta, loss_agg_mode=rl.loss_agg_mode, max_completion_length=rl.max_new_tokens,
        importance_sampling_level=rl.importance_sampling_level, sampler_is_correction=rl.sampler_is_correction,
        sampler_is_cap=rl.sampler_is_cap,
    )
    trainer = Trainer(
        model, loss_fn, dataclasses.replace(tcfg, num_steps=total * updates_per_step),
        stage_dir(workdir, "rl"), mesh=train_mesh, rules=rules,
        trainable=filter_for_stage("rl", model.latent_cfg), name="rl",
    )
    stream = PromptStream(len(examples), rl.num_prompts, cfg.run.seed)
    if trainer.restore(stream):
        print(f"[rl] resumed at RL step {stream.steps} ({trainer.step} updates)", flush=True)
    if trainer.step != stream.steps * updates_per_step:
        raise ConfigError(f"{trainer.dir / 'checkpoints'}: {trainer.step} updates after {stream.steps} RL steps, "
                          f"but this config makes {updates_per_step} per step (rl.inner_epochs x rl.num_prompts x "
                          "rl.group_size / train.rl.batch_size): resume with the settings the stage started with, "
                          "adding --set run.allow_config_change=true (the workdir's config.yaml now records the new "
                          "ones), or start the stage over in a new --workdir")

    # Sampling copy of the policy (dlr_jax/generate/sampling_copy.py): cast to rl.sample_dtype and resharded onto
    # the decoding layout on device after every step (`GRPOStep.update`).
    # (Where neither changes anything the copy is the trainer's own buffers, which the next update
    # donates — so the state is swapped in again after every update, before any use.)
    graphdef, state = nnx.split(nnx.merge(trainer.graphdef, trainer.params, trainer.rest))
    copy = SamplingCopy(state, smesh, rules, copy_dtype(rl.sample_dtype, model.backbone.cfg))
    unstack = cfg.sampling.unstack
    sampler = Sampler((graphdef, copy(state)), mesh=smesh, rules=rules, prompt_bucket=prompt_len,
                      unstack_layers=unstack)
    if jax.process_index() == 0:
        print(f"[rl] rollouts: sampling copy in {copy.dtype or 'the parameter dtype'} on mesh "
              f"{dict(smesh.shape)}; decode loop: {'layers unstacked' if sampler.unstack_layers else 'layer scan'} "
              f"(sampling.unstack_layers={cfg.sampling.unstack_layers})", flush=True)
    # The reference (SFT) weights, scored by the same compiled function with its state swapped in.
    ref_state = None
    if rl.beta != 0:
        ref_state = copy(nnx.state(load_latent_stage(cfg, workdir, "sft", tok, smesh)))

    weights = {"answer": rl.answer_weight, "format": rl.format_weight} | extra_reward_weights(rl)
    extras: dict[str, Any] = {}
    if rl.process_weight == 0:
        print("[rl] process reward off (rl.process_weight=0)", flush=True)
    elif latent_decoder is None and cfg.latent.source != "codebook":  # its OCR decoder reads codebook ids only
        print(f"[rl] process reward skipped: latent.source={cfg.latent.source} ids are not the codebook's, its OCR "
              "decoder cannot read them (rl.process_weight=0 silences this)", flush=True)
    else:
        decoder = latent_decoder or load_latent_decoder(cfg, workdir, smesh)
        if decoder is None:
            print(f"[rl] process reward skipped: no OCR decoder in {Path(workdir) / 'codebook'} (run --stage "
                  "codebook; rl.process_weight=0 silences this)", flush=True)
        else:
            if cfg.codebook.render_view != "cot":  # the evaluator learnt whole chains, the decoder reads the view
                print(f"[rl] note: the OCR decoder reads codes back as codebook.render_view={cfg.codebook.render_view} "
                      "text, which the process reward's evaluator (trained on whole CoTs) sees as the CoT", flush=True)
            if step_codes is not None:
                print(f"[rl] process reward: generated latents decoded {step_codes} codes a step "
                      "(codebook.render_unit=step), the steps' texts joined as the CoT", flush=True)
            evaluator = load_evaluator(cfg, workdir, tok, smesh)
            extras["process_reward"] = ProcessReward(
                decoder, Sampler(evaluator, mesh=smesh, rules=rules, prompt_bucket=bucket, unstack_layers=unstack), tok,
                max_new_tokens=rl.process_max_new_tokens, max_cot_tokens=rl.process_max_cot_tokens,
                batch_size=min(rl.process_batch_size, p_g), step_codes=step_codes,
            )
            weights["process"] = rl.process_weight
    grpo_step = GRPOStep(cfg, tok, trainer, sampler, copy, prompt_len=prompt_len, vocab_mask=vocab_mask,
                         ref_state=ref_state, weights=weights, extras=extras)

    eval_temperature = {} if rl.eval_temperature is None else {"temperature": rl.eval_temperature}

    def held_out_score(rows: list[list[int]], group: list[Any], chunk: int):
        # the same key at every evaluation: common random numbers across the curve
        out = grpo_step.generate(rows, rng=jax.random.fold_in(jax.random.key(cfg.run.seed + 1_000_003), chunk),
                                 **eval_temperature)
        parsed, reward, parts = grpo_step.rewards(out, group)
        return reward, parts, [extract_answer(p.text) for p in parsed]  # the answers vote for maj@k

    evaluate = held_out_evaluator(cfg, tok, prompt_len, p_g, held_out_score, pool=examples)

    window = ProfileWindow(tcfg.profile_steps, trainer.dir / "profile", "rl", stream.steps, total)  # a bad one raises
    if stream.eval_pending and stream.steps and jax.process_index() == 0:
        # the evaluation is logged again below: the row of an attempt killed after logging it goes (before the
        # writer opens the file, which this replaces)
        drop_rows(trainer.dir / "metrics.jsonl", stream.steps, "eval/")
    # From step 0 the run evaluates step 0 again (log_eval below): an earlier attempt's row goes too.
    writer = MetricsWriter(trainer.dir, enabled=jax.process_index() == 0, resume_step=stream.steps or -1)
    signals = preemption.handling_signals()
    signals.__enter__()
    history: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    preempted = False
    def log_eval(step: int) -> None:
        if evaluate is None:
            return
        m = evaluate()
        writer.write(step, m)
        evals.append({"step": step, **m})
        if jax.process_index() == 0:
            print(f"[rl] eval ({rl.eval_split or cfg.data.eval_split} prompts) step {step}: reward "
                  f"{m['eval/reward']:.4f} acc {m.get('eval/accuracy', 0.0):.4f} ({int(m['eval/rollouts'])} rollouts)"
                  + "".join(f" {k[5:]} {v:.4f}" for k, v in m.items() if k.startswith(("eval/pass@", "eval/maj@"))),
                  flush=True)

    def refill() -> tuple[list[list[int]], list[Any]]:
        # the stream's next prompts within the same RL step: its checkpointed position covers them, so a
        # resumed run draws what an uninterrupted one would
        more = stream.draw()
        return ([prompts[i] for i in more for _ in range(rl.group_size)],
                [examples[i] for i in more for _ in range(rl.group_size)])

    def eval_due(step: int) -> bool:
        return bool(rl.eval_prompts) and (step % rl.eval_every == 0 or step == total)

    try:
        if stream.steps == 0:
            log_eval(0)
        elif stream.eval_pending:  # stopped or killed before this step's evaluation was logged
            log_eval(stream.steps)
            stream.eval_pending = False
        while stream.steps < total:
            window.before(stream.steps)
            idx = next(stream)
            step = stream.steps
            group = [examples[i] for i in idx for _ in range(rl.group_size)]
            rows = [prompts[i] for i in idx for _ in range(rl.group_size)]
            metrics = grpo_step(rows, group, step, refill=refill if rl.dynamic_sampling else None)
            window.after(step)
            writer.write(step, metrics)
            history.append({"step": step, **metrics})
            if (step % tcfg.log_every == 0 or step == total) and jax.process_index() == 0:
                print(f"[rl] step {step}/{total} reward {metrics['reward']:.3f} acc {metrics['accuracy']:.3f} "
                      f"#L {metrics['n_latents']:.1f} kl {metrics.get('kl', 0.0):.4f} clip "
                      f"{metrics['clip_fraction']:.3f} ({metrics['time/step']:.1f}s)"
                      + (f" dropped {int(metrics['dynamic/groups_dropped'])} groups, {int(metrics['dynamic/refills'])} "
                         "refills" if rl.dynamic_sampling else ""), flush=True)
            # every step syncs on the host here (rewards), so all processes can agree on every step
            if preemption.should_stop():  # saved at once; a due evaluation runs when the run resumes
                print(f"[rl] stop requested: saving RL step {step} and exiting", flush=True)
                stream.eval_pending = eval_due(step)
                trainer.save(stream, force=True)
                preempted = True
                break
            if step % tcfg.checkpoint_every == 0 or step == total:
                stream.eval_pending = eval_due(step)
                trainer.save(stream, force=True)
                stream.eval_pending = False
            if eval_due(step):
                log_eval(step)
    finally:
        window.close()
        writer.close()
        signals.__exit__(None, None, None)
    final = trainer.finalize()
    if not preempted:
        save_stage_model(final, workdir, "rl", kind="latent_lm", model_cfg=final.model_cfg,
                                extra={"rl_steps": stream.steps})
    return RLResult(final, stream.steps, preempted, history, evals)
