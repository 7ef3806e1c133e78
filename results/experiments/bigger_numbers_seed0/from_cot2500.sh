#!/bin/bash
# bigger numbers, seed 0: DLR-SFT / DLR-Full from the 2500-step CoT-SFT (the matched one, which can compute),
# reusing seed 0's codebook + latents; then the control (Direct-SFT from that CoT-SFT)
set -e
cd /work/wt_big
PY=/work/main/.venv/bin/python
S0=/work/runs/big/seed0
SETS="--config configs/tiny.yaml --set latent.source=codebook --set train.sft.num_steps=1600 --set train.textsft_direct.num_steps=2500 --set codebook.font_mean=8.75 --set codebook.font_std=0.75 --set codebook.font_min=8 --set codebook.font_max=10 --set codebook.min_side=64 --set codebook.max_side=64 --set data.synthetic_max_operand=100 --set data.synthetic_max_value=2000 --set data.max_len=128 --set codebook.max_text_len=80 --set eval.benchmarks=[synthetic,synthetic_hard] --set run.seed=0 --set train.textsft.seed=0 --set train.textsft_direct.seed=0 --set train.align.seed=0 --set train.sft.seed=0 --set train.rl.seed=0 --set codebook.train.seed=0 --set train.textsft.num_steps=2500 --set train.align.progress=false --set train.sft.progress=false --set train.rl.progress=false --set train.textsft_direct.progress=false --set run.allow_config_change=true"
W=$S0/cot2500
mkdir -p $W
cp -n $S0/main/data_protocol.json $W/
ln -sfn ../matched/textsft_cot $W/textsft_cot
for d in tokenizer codebook export latents textsft_direct; do [ -e $W/$d ] || ln -s ../main/$d $W/$d; done
for st in align sft rl; do
  [ -f $W/$st/final/meta.json ] || $PY -m dlr_jax.train --stage $st --workdir $W $SETS
done
for st in sft rl; do
  [ -f $W/$st/eval/results.json ] || $PY -m dlr_jax.evaluate --workdir $W --stage $st --config configs/tiny.yaml --set 'eval.benchmarks=[synthetic,synthetic_hard]' --no-progress
done
C=$S0/cot2500_ctl
mkdir -p $C
cp -n $S0/main/data_protocol.json $C/
ln -sfn ../matched/textsft_cot $C/textsft_cot
for d in tokenizer textsft_direct; do [ -e $C/$d ] || ln -s ../main/$d $C/$d; done
$PY -m dlr_jax.train --stage textsft --mode direct_from_cot --workdir $C $SETS --set train.textsft_direct.num_steps=1700 --set train.textsft_direct.num_epochs=0 --set train.textsft_direct.learning_rate=0.001 --set train.textsft_direct.progress=false
$PY -m dlr_jax.evaluate --workdir $C --stage textsft_direct_from_cot --config configs/tiny.yaml --set 'eval.benchmarks=[synthetic,synthetic_hard]' --no-progress
echo ALLDONE
