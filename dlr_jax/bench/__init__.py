"""Benchmarks that write their own sections of BENCHMARKS.md.

    python -m dlr_jax.bench --out BENCHMARKS.md [--only sampling,compile] [--size small|medium]

One module a benchmark, all sharing `common` (sizes, timing, the machine line, section markers):

- `sampling`: greedy tokens/s of `dlr_jax.generate.sampler.Sampler` against `transformers` `generate`
  (PyTorch, KV cache) on the *same* weights: a random HF Llama is saved and imported with
  `load_hf`, so both sides run identical fp32 parameters; the greedy tokens are compared. Where
  JAX's default device is a GPU, both sides run on it (section `sampling_gpu`, with the sampler's
  unstacked-layer loop timed as well); `make bench` pins JAX to the CPU.
- `compile`: XLA compile time of a deep vs a shallow model forward of the same width, for the
  scanned layer stack (and, as the reference, the same layers unrolled in Python).
- `train`: SFT train-step tokens/s of `dlr_jax.training.trainer.Trainer` against PyTorch `transformers` +
  AdamW on the same weights and batch (`--train-cases demo,medium`).
- `codebook`: CoT rendering images/s per core against encoder + VQ and codebook train-step images/s
  on the config's codebook networks and real GSM8K-Aug CoTs.
- `rl`: rollout tokens/s and the time split of one latent-GRPO step, by `dlr_jax.stages.rl.stage.run`'s
  own `time/*` metrics.
- `grpo_peers`: seconds per GRPO step and per phase of dlr_jax (`grpo_ours`, the stage's `GRPOStep`),
  TRL's `GRPOTrainer` (`peer_trl`) and tunix's `GRPOLearner` (`peer_tunix`) on one random Llama, each
  framework in its own process (the peers in their own venvs, `make peers`), speaking `peer_protocol`.
- `render_cache`: codebook batches images/s read from a rendered corpus (`dlr_jax.data.render_corpus`)
  vs drawn on the fly, at the tiny config's canvas and at 1024 px.
- `latent_cost`: #L, generated tokens and wall time per question of Direct-SFT, CoT-SFT, DLR-SFT and
  DLR-Full from one trained workdir (`make demo`'s runs/demo/pipeline by default), interleaved.
- `pack`: examples/s of the DLR-SFT step on padded vs packed rows of GSM8K-Aug's training examples, tokenized
  with the config's tokenizer and with SmolLM2-135M's (`--pack-tokenizer`).

`python -m dlr_jax.bench.plan_report` writes the planner's table (`dlr_jax.plan.cli`) the same way, and
`python -m dlr_jax.bench.gpu` (`make bench-gpu`) the `gpu` section: on one H100 / H200, the SFT step of a
Llama-3.2-1B-shaped model on packed rows against PyTorch, GRPO at that shape, and the planner's roofline and
memory beside the measured ones (`--dry-run`: the same code on the CPU at a toy size).

Both sides of every ratio are measured in the same process, interleaved repeat by repeat, so a
busy shared machine slows them alike; the medians are reported. Each benchmark rewrites only the
text between its `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` markers and leaves the rest of
the file alone (other benchmarks add their own sections).
"""
