"""TRL's side of `grpo_peers`: a GRPO worker around `trl.GRPOTrainer` (run by the TRL venv's python).

    .peers/trl/bin/python dlr_jax/bench/peer_trl.py WORKLOAD.json

Imports only the standard library, TRL and its stack (no dlr_jax: it is not installed there). The
trainer is TRL's own, driven by `trainer.train()`; a callback pauses it between GRPO steps until the
orchestrator asks for the next one, and the phases are timed by wrapping the trainer's methods
(TRL's own `profiling_context` only logs, averaged, to its metrics):

- generate: `_generate_single_turn` (`transformers` `generate` with its KV cache);
- score: `_get_per_token_logps_and_entropies` called inside `_generate_and_score_completions`
  (old-policy log-probs when TRL needs them, and the reference model's);
- rewards: the rest of `_generate_and_score_completions` (tokenizing, the reward, advantages);
- update: everything else of the mu optimizer steps (forward + backward + AdamW, per
  `training_step`), i.e. the step's wall time minus the three above.

One GRPO step = `num_iterations` (mu) optimizer steps over one generation batch of P x G
completions, each step one minibatch of all of them (steps_per_generation = 1).
"""

from __future__ import annotations

import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import peer_protocol as protocol  # this folder is first on sys.path when run as a script


class PhaseClock:
    """Seconds spent in wrapped methods since the last `reset`, by phase. `sync()` waits for the
    device (CUDA runs asynchronously: a phase ends when its kernels have finished)."""

    def __init__(self, sync: Any = lambda: None) -> None:
        self.sync = sync
        self.reset()
        self.scoring = False  # inside _generate_and_score_completions

    def reset(self) -> None:
        self.t0 = time.perf_counter()
        self.spent = {"generate": 0.0, "score": 0.0, "gen_and_score": 0.0}

    def wrap(self, obj: Any, name: str, phase: str, *, only_when_scoring: bool = False,
             marks_scoring: bool = False) -> None:
        inner = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if only_when_scoring and not self.scoring:
                return inner(*args, **kwargs)
            if marks_scoring:
                self.scoring = True
            self.sync()  # work queued before the phase is not the phase's
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.sync()
                self.spent[phase] += time.perf_counter() - t
                if marks_scoring:
                    self.scoring = False

        setattr(obj, name, timed)

    def record(self) -> dict[str, float]:
        self.sync()
        total = time.perf_counter() - self.t0
        s = self.spent
        rewards = s["gen_and_score"] - s["generate"] - s["score"]
        return protocol.step_record(total, generate=s["generate"], score=s["score"], rewards=rewards,
                                    update=total - s["gen_and_score"])


def build_trainer(work: dict[str, Any], out_dir: str) -> Any:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(work["seed"])
    mu, p, g = work["mu"], len(work["prompts"]), work["group"]
    args = GRPOConfig(
        output_dir=out_dir, use_cpu=work.get("device", "cpu") == "cpu", bf16=False,  # fp32 like the other two
        per_device_train_batch_size=p * g, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=g, num_iterations=mu, max_steps=mu * work["steps"],
        max_completion_length=work["new_tokens"], generation_kwargs={"min_new_tokens": work["new_tokens"]},
        temperature=work["temperature"], top_p=1.0, top_k=0,
        beta=work["beta"], epsilon=work["epsilon"], loss_type="dapo", scale_rewards="group",
        learning_rate=work["lr"], lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
        disable_dropout=True, logging_steps=10**9, save_strategy="no", report_to="none", seed=work["seed"],
        dataloader_num_workers=0, log_completions=False,
    )
    tok = AutoTokenizer.from_pretrained(work["hf_dir"])
    model = AutoModelForCausalLM.from_pretrained(work["hf_dir"], dtype=torch.float32)
    data = datasets.Dataset.from_dict({"prompt": work["prompt_texts"]})

    def even_ids(completion_ids: list[list[int]], **_: Any) -> list[float]:
        return [protocol.cheap_reward(c) for c in completion_ids]

    return GRPOTrainer(model=model, reward_funcs=even_ids, args=args, train_dataset=data, processing_class=tok)


def main(argv: list[str]) -> None:
    from transformers import TrainerCallback

    if len(argv) != 1:
        raise SystemExit("usage: peer_trl.py WORKLOAD.json")
    import torch

    work = protocol.load_workload(argv[0])
    on_gpu = work.get("device", "cpu") == "gpu"
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("peer_trl.py: the workload asks for a GPU and torch sees none")
    clock = PhaseClock(torch.cuda.synchronize if on_gpu else lambda: None)
    mu = work["mu"]

    class StepGate(TrainerCallback):
        """Pauses training between GRPO steps: reports the last one, waits for the next command."""

        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001 - TRL's signature
            self._next(control)

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            if state.global_step % mu == 0:
                protocol.send(protocol.STEP, clock.record())
                self._next(control)

        def _next(self, control: Any) -> None:
            if protocol.wait_command() == "step":
                clock.reset()
            else:
                control.should_training_stop = True

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(work, str(Path(tmp) / "out"))
        clock.wrap(trainer, "_generate_single_turn", "generate")
        clock.wrap(trainer, "_get_per_token_logps_and_entropies", "score", only_when_scoring=True)
        clock.wrap(trainer, "_generate_and_score_completions", "gen_and_score", marks_scoring=True)
        trainer.add_callback(StepGate())
        tf32 = "on" if torch.backends.cuda.matmul.allow_tf32 else "off (torch's default)"
        where = (f"on {torch.cuda.get_device_name()}, TF32 matmuls {tf32}" if on_gpu
                 else f"torch threads {torch.get_num_threads()}")
        protocol.send(protocol.READY, {"versions": {
            "framework": "TRL", "trl": version("trl"), "torch": torch.__version__,
            "transformers": version("transformers"), "accelerate": version("accelerate")},
            "notes": ["fp32 (bf16=False)", where,
                      "old-policy log-probs computed by TRL only when num_iterations > 1 (its own rule)",
                      "EOS masked by min_new_tokens in sampling but not in TRL's scoring"]})
        trainer.train()


if __name__ == "__main__":
    main(sys.argv[1:])
