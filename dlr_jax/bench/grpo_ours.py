"""dlr_jax's side of `grpo_peers`: a GRPO worker that runs the stage's own `GRPOStep` phases.

    python -m dlr_jax.bench.grpo_ours WORKLOAD.json   (started by `grpo_peers`; see peer_protocol.py)

The policy and the reference are the workload's HF Llama imported with `load_hf`; the step is
`dlr_jax.stages.rl.step.GRPOStep` built as `stages.rl.run` builds it (trainer, sampling copy, sampler,
reference state), its phases called in `GRPOStep.__call__`'s order: rollout -> score -> (the
workload's reward) -> advantages -> update. Only the reward differs from the stage: the latent
reward parses boundary tokens that a plain Llama never emits, so the workload's token reward
(`peer_protocol.cheap_reward`) stands in for it, as it does in the peers.
"""

from __future__ import annotations

import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlr_jax.bench import peer_protocol as protocol
from dlr_jax.bench.common import TINY_CONFIG, version


def stage_config(work: dict[str, Any]) -> Any:
    """The rl stage's config for the workload: plain sampling (no latent grammar), one minibatch of
    all rollouts per optimizer step, constant learning rate, no weight decay (TRL's defaults)."""
    from dlr_jax.config import load_config

    p, g = len(work["prompts"]), work["group"]
    return load_config(TINY_CONFIG, [
        f"rl.num_prompts={p}", f"rl.group_size={g}", f"rl.max_new_tokens={work['new_tokens']}",
        "rl.max_latents=0", "rl.constrain_format=false", f"rl.temperature={work['temperature']}", "rl.top_k=0",
        "rl.top_p=1.0", f"rl.inner_epochs={work['mu']}", f"rl.beta={work['beta']}", f"rl.epsilon={work['epsilon']}",
        "rl.process_weight=0", f"train.rl.batch_size={p * g}", f"train.rl.learning_rate={work['lr']}",
        "train.rl.warmup_ratio=0", "train.rl.min_lr_ratio=1.0", "train.rl.weight_decay=0",
        "train.rl.progress=false", f"run.seed={work['seed']}",
        f"sampling.unstack_layers={work.get('unstack_layers', 'auto')}",
    ])


def build_step(work: dict[str, Any], workdir: str,
               make_model: Callable[[Any, Any], Any] | None = None) -> Callable[[int], dict[str, float]]:
    """Builds the stage's GRPOStep on the workload's model; returns `step(i) -> STEP payload`. `make_model(mesh,
    rules)`: the policy, born on `mesh` (called again for the reference); default: the workload's HF Llama."""
    import dataclasses

    import jax
    from flax import nnx

    from dlr_jax.convert import load_hf
    from dlr_jax.core.sharding import mesh_from_config
    from dlr_jax.generate.sampler import Sampler
    from dlr_jax.generate.sampling_copy import SamplingCopy, copy_dtype, sample_mesh_for
    from dlr_jax.stages.rl.loss import make_grpo_loss
    from dlr_jax.stages.rl.step import GRPOStep
    from dlr_jax.training.trainer import Trainer

    cfg = stage_config(work)
    rl, rules = cfg.rl, cfg.mesh.rules
    mesh = mesh_from_config(cfg.mesh)
    if make_model is None:
        def make_model(m, r):
            return load_hf(work["hf_dir"], mesh=m, rules=r)[1]
    model = make_model(mesh, rules)
    vocab = model.cfg.vocab_size
    # The end-of-sequence id is never sampled: every completion is exactly new_tokens long, as the
    # peers' min_new_tokens makes theirs.
    vocab_mask = np.ones((vocab,), bool)
    vocab_mask[work["eos_id"]] = False
    loss_fn = make_grpo_loss(temperature=rl.temperature, vocab_mask=vocab_mask, epsilon=rl.epsilon, beta=rl.beta,
                             loss_agg_mode=rl.loss_agg_mode, max_completion_length=rl.max_new_tokens)
    steps = work["steps"] * rl.inner_epochs
    trainer = Trainer(model, loss_fn, dataclasses.replace(cfg.train.rl, num_steps=steps), workdir, mesh=mesh,
                      rules=rules, name="rl")
    smesh = sample_mesh_for(rl.sample_mesh, mesh, model.cfg, vocab)
    graphdef, state = nnx.split(nnx.merge(trainer.graphdef, trainer.params, trainer.rest))
    copy = SamplingCopy(state, smesh, rules, copy_dtype(rl.sample_dtype, model.cfg))
    prompt_len = max(map(len, work["prompts"]))
    sampler = Sampler((graphdef, copy(state)), mesh=smesh, rules=rules, prompt_bucket=prompt_len,
                      unstack_layers=cfg.sampling.unstack)
    ref_state = copy(nnx.state(make_model(smesh, rules))) if rl.beta else None
    eos = work["eos_id"]
    # Only pad/stop ids are read outside the latent reward, which this workload replaces.
    tok = types.SimpleNamespace(pad_id=work["pad_id"], eos_id=eos, answer_end_id=eos, latent_start_id=eos,
                                latent_end_id=eos, answer_start_id=eos, latent_offset=vocab, num_latents=0)
    grpo = GRPOStep(cfg, tok, trainer, sampler, copy, prompt_len=prompt_len, vocab_mask=vocab_mask,
                    ref_state=ref_state, weights={}, extras={})
    rows = [list(p) for p in work["prompts"] for _ in range(work["group"])]

    def step(i: int) -> dict[str, float]:
        t0 = time.perf_counter()
        ro = grpo.rollout(rows, i)
        t1 = time.perf_counter()
        grpo.score(ro)
        t2 = time.perf_counter()
        out = ro.out
        reward = np.array([protocol.cheap_reward(out.tokens[r, : out.lengths[r]].tolist()) for r in range(len(rows))])
        ro.batch["advantages"] = grpo.advantages(reward)
        t3 = time.perf_counter()
        grpo.update(ro.batch, i)
        jax.block_until_ready(grpo.sampler.state)  # the new sampling copy is part of the update
        t4 = time.perf_counter()
        if not (out.lengths == work["new_tokens"]).all():
            raise RuntimeError(f"completion lengths {sorted(set(out.lengths.tolist()))}, expected {work['new_tokens']}")
        return protocol.step_record(t4 - t0, generate=t1 - t0, score=t2 - t1, rewards=t3 - t2, update=t4 - t3)

    step.unstacked = sampler.unstack_layers  # type: ignore[attr-defined] - for the worker's notes
    return step


def versions() -> dict[str, str]:
    import jax

    return {"framework": "dlr_jax", "jax": jax.__version__, "flax": version("flax"), "optax": version("optax"),
            "device": jax.devices()[0].device_kind}


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        raise SystemExit("usage: python -m dlr_jax.bench.grpo_ours WORKLOAD.json")
    work = protocol.load_workload(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        step = build_step(work, tmp)
        layout = "layers unstacked" if getattr(step, "unstacked", False) else "layer scan"
        protocol.send(protocol.READY, {"versions": versions(), "notes": [
            "the reward replaces the stage's latent reward (no boundary tokens in a plain Llama)",
            f"rollouts' decode loop: {layout} (sampling.unstack_layers={work.get('unstack_layers', 'auto')})"]})
        i = 0
        while protocol.wait_command() == "step":
            i += 1
            protocol.send(protocol.STEP, step(i))


if __name__ == "__main__":
    main()
