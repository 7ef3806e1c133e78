#!/bin/bash
cd /work/wt_rv
P=/work/main/.venv/bin/python
SETS="--set latent.source=codebook --set train.sft.num_steps=4800 --set train.textsft_direct.num_steps=2500 --set codebook.render_view=results --set codebook.train.num_steps=6400"
while pgrep -f "experiments main --seeds 1 --workdir /work/runs/rvl48 " >/dev/null; do sleep 20; done
$P -m dlr_jax.experiments main --seeds 1 --workdir /work/runs/rvl48 --config configs/tiny.yaml $SETS
$P -m dlr_jax.latent_probe --workdir /work/runs/rvl48/seed0/main --stage sft
mkdir -p /work/runs/rvl48/seed0/direct_from_cot && cd /work/runs/rvl48/seed0/direct_from_cot && for d in textsft_cot textsft_direct tokenizer; do ln -sfn /work/runs/rvl48/seed0/main/$d $d; done
cd /work/wt_rv
$P -m dlr_jax.train --stage textsft --config configs/tiny.yaml --workdir /work/runs/rvl48/seed0/direct_from_cot --mode direct_from_cot $SETS --set train.textsft_direct.num_steps=4900 --set train.textsft_direct.num_epochs=0 --set train.textsft_direct.learning_rate=0.001 --set run.seed=0 --set train.textsft.seed=0 --set train.textsft_direct.seed=0 --set train.align.seed=0 --set train.sft.seed=0 --set train.rl.seed=0 --set codebook.train.seed=0
$P -m dlr_jax.experiments main --seeds 1 --matched-baselines --workdir /work/runs/rvl48 --config configs/tiny.yaml $SETS --report-only
# the control's evaluation and the final table (run by hand after the script above, 2026-11-27 13:50 UTC):
# python -m dlr_jax.evaluate --workdir /work/runs/rvl48/seed0/direct_from_cot --stage textsft_direct_from_cot --config configs/tiny.yaml
# python -m dlr_jax.experiments main --seeds 1 --matched-baselines --workdir /work/runs/rvl48 --config configs/tiny.yaml $SETS --report-only
# Before the script: /work/runs/rvl48/seed0/main/{textsft_cot,textsft_direct,tokenizer} linked to seed 0's budget-matched
# `main` run and {codebook,export,latents,align} to /work/runs/rvl/seed0/main (the 6400-step results codebook).
