"""tunix's side of `grpo_peers`: a GRPO worker around tunix's `GRPOLearner` (run by the tunix venv).

    .peers/tunix/bin/python dlr_jax/bench/peer_tunix.py WORKLOAD.json

Imports only the standard library, tunix and its stack (no dlr_jax). The policy and the reference
are tunix's own Llama-3 (`tunix.models.llama3`) loaded from the workload's safetensors; the
learner's own `train()` loop runs, and a wrapper around its `_run_global_step` pauses it between
GRPO steps until the orchestrator asks for the next one. Phases, by wrapping the cluster's methods:

- generate: `RLCluster.generate` (tunix's "vanilla" JAX sampler with its KV cache);
- score: `get_ref_per_token_logps` + `get_old_per_token_logps` (tunix asks for old log-probs
  only when num_iterations > 1);
- rewards: the rest of `_generate_and_compute_advantage` (decoding, the reward, advantages);
- update: everything else (mu `update_actor` passes, weight sync, its metric bookkeeping).
"""

from __future__ import annotations

import itertools
import sys
import time
from importlib.metadata import version
from typing import Any

import peer_protocol as protocol  # this folder is first on sys.path when run as a script


class Stop(StopIteration):
    """Raised inside the learner's loop to end `train()` (its loop breaks on StopIteration)."""


class Clock:
    def __init__(self) -> None:
        self.t0: float | None = None
        self.spent = {"generate": 0.0, "score": 0.0, "gen_adv": 0.0}

    def wrap(self, obj: Any, name: str, phase: str) -> None:
        inner = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[phase] += time.perf_counter() - t

        setattr(obj, name, timed)

    def report_and_wait(self, settle: Any = None) -> None:
        """Reports the step in progress (if any), then waits for the next command. `settle()` blocks
        until the device has finished the step's work (tunix returns from its update before that)."""
        if self.t0 is not None:
            if settle is not None:
                settle()
            total, s = time.perf_counter() - self.t0, self.spent
            protocol.send(protocol.STEP, protocol.step_record(
                total, generate=s["generate"], score=s["score"], rewards=s["gen_adv"] - s["generate"] - s["score"],
                update=total - s["gen_adv"]))
        if protocol.wait_command() != "step":
            raise Stop
        self.t0 = time.perf_counter()
        self.spent = dict.fromkeys(self.spent, 0.0)


def build_learner(work: dict[str, Any]) -> Any:
    import jax
    import optax
    from transformers import AutoConfig, AutoTokenizer
    from tunix.models.llama3 import model as llama_lib
    from tunix.models.llama3 import params as llama_params
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    hf = AutoConfig.from_pretrained(work["hf_dir"])
    cfg = llama_lib.ModelConfig(
        num_layers=hf.num_hidden_layers, vocab_size=hf.vocab_size, embed_dim=hf.hidden_size,
        hidden_dim=hf.intermediate_size, num_heads=hf.num_attention_heads,
        head_dim=hf.hidden_size // hf.num_attention_heads, num_kv_heads=hf.num_key_value_heads,
        rope_theta=int(work["rope_theta"]), norm_eps=hf.rms_norm_eps, weight_tying=False)
    auto = (jax.sharding.AxisType.Auto,) * 2  # tunix's model code is written for Auto (not Explicit) axes
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto, devices=jax.devices()[:1])
    load = lambda: llama_params.create_model_from_safe_tensors(work["hf_dir"], cfg, mesh)
    actor, ref = load(), load() if work["beta"] else None
    tok = AutoTokenizer.from_pretrained(work["hf_dir"])
    p, g, n = len(work["prompts"]), work["group"], work["new_tokens"]
    plen = max(map(len, work["prompts"]))
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=n, max_prompt_length=plen, kv_cache_size=plen + n + 8,
        temperature=work["temperature"], top_p=1.0, top_k=None,
        eos_tokens=[hf.vocab_size + 1])  # an id never sampled: every completion runs the full n tokens
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(work["lr"], weight_decay=0.0))
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=opt, eval_every_n_steps=10**9, max_steps=10**9, mini_batch_size=p,
        train_micro_batch_size=p, pbar_description=None)
    roles = rl_cluster_lib.Role
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=ref, tokenizer=tok,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False, training_config=training, rollout_config=rollout))
    algo = grpo_learner.GRPOConfig(num_generations=g, num_iterations=work["mu"], beta=work["beta"],
                                   epsilon=work["epsilon"], loss_agg_mode="token-mean", kl_loss_mode="low_var_kl")

    def even_ids(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        # completions come back as text ("t12 t7 ..."): the reward reads the ids from the words
        ids = [[int(w[1:]) for w in c.split() if w[1:].isdigit()] for c in completions]
        return [protocol.cheap_reward(x) for x in ids]

    return grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=even_ids)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: peer_tunix.py WORKLOAD.json")
    work = protocol.load_workload(argv[0])
    learner = build_learner(work)
    clock = Clock()
    cluster = learner.rl_cluster
    clock.wrap(cluster, "generate", "generate")
    clock.wrap(cluster, "get_ref_per_token_logps", "score")
    clock.wrap(cluster, "get_old_per_token_logps", "score")
    clock.wrap(learner, "_generate_and_compute_advantage", "gen_adv")
    inner = learner._run_global_step

    import jax
    from flax import nnx

    def settle() -> None:
        jax.block_until_ready(nnx.state(cluster.actor_trainer.model))

    def gated(*args: Any, **kwargs: Any) -> Any:
        clock.report_and_wait(settle)
        return inner(*args, **kwargs)

    learner._run_global_step = gated

    protocol.send(protocol.READY, {"versions": {
        "framework": "tunix", "tunix": version("google-tunix"), "jax": jax.__version__, "flax": version("flax"),
        "device": jax.devices()[0].device_kind},
        "notes": ["tunix's Llama-3 (tunix.models.llama3) from the same safetensors; fp32",
                  "no EOS stop: the rollout's eos_tokens is an id outside the vocabulary",
                  "old-policy log-probs computed by tunix only when num_iterations > 1 (its own rule)",
                  "its scoring returns before the device finishes (async dispatch): that time lands in the "
                  "next phase that waits, so its score column reads low and its step total is what counts "
                  "(each step ends when the actor's weights are ready)"]})
    import numpy as np

    batch = {"prompts": np.array(work["prompt_texts"])}  # one leaf: tunix tree-maps np.repeat over the batch
    # The gate reports each step when the next one is asked for, and raises Stop on `quit`, which
    # train()'s loop takes as the end of its data.
    learner.train(itertools.repeat(batch))


if __name__ == "__main__":
    main(sys.argv[1:])
