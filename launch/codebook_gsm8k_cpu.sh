#!/usr/bin/env bash
# The CPU-sized GSM8K codebook run behind BENCHMARKS.md (row cbI): configs/tiny.yaml's model sizes,
# 256-px canvases (N = 16 codes), 25-31 px glyphs, a piece warm-up, a whole-CoT warm-up, then the
# main phase lengthened in rounds. Each round resumes the same workdir with a larger
# codebook.train.num_steps, which re-spans the cosine schedule (a warm restart): this is how the
# reported run was made, so the numbers reproduce only with the same rounds.
#
#   bash launch/codebook_gsm8k_cpu.sh WORKDIR [ROUNDS]     # ROUNDS default "2000 4000 7000 10000" (no --dry-run)
#
# Run it from the repository root; the CoTs come from $DLR_DATA_DIR (default: the shared data dir,
# see dlr_jax/data/paths.py; `python -m dlr_jax.data.download gsm8k gsm8k_aug` fetches them).
# About 4 h on a quiet 2-core CPU; interrupt it at any time and rerun the same command to resume.
# Each round ends with the held-out report (CER with true / shuffled ids, perplexity) printed and
# saved to WORKDIR/codebook/report.json; a copy per round goes to WORKDIR/report_<steps>.json.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then  # the header above, not a workdir named --help
  sed -n '2,/^[^#]/{/^#[^!S]/s/^# \{0,1\}//p;/^#$/s/^#//p}' "$0"
  exit 0
fi
WORKDIR=${1:?usage: codebook_gsm8k_cpu.sh WORKDIR [ROUNDS]}
ROUNDS=${2:-2000 4000 7000 10000}
PY=${PYTHON:-python}
for steps in $ROUNDS; do
  # a finished round keeps its report: a rerun after an interruption goes on from the first round without one
  # (rerunning a finished round would rebuild report.json from the later checkpoint and overwrite the copy)
  if [ -f "$WORKDIR/report_$steps.json" ]; then echo "round $steps: done earlier ($WORKDIR/report_$steps.json)"; continue; fi
  JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} "$PY" -m dlr_jax.train --stage codebook --config configs/tiny.yaml \
    --workdir "$WORKDIR" \
    --set 'codebook.corpus=[gsm8k_aug:train_subset_3000,gsm8k:train]' \
    --set 'codebook.eval_corpus=[gsm8k:test]' \
    --set codebook.flow_visual_skip=true \
    --set codebook.warmup_steps=1000 --set codebook.warmup_piece_chars=40 \
    --set codebook.warmup_whole_steps=2500 --set codebook.warmup_char_dropout=1.0 \
    --set codebook.alpha_steps=500 --set codebook.max_text_len=112 --set codebook.dead_code_every=250 \
    --set codebook.font_mean=28 --set codebook.font_std=1.5 --set codebook.font_min=25 --set codebook.font_max=31 \
    --set codebook.min_side=256 --set codebook.max_side=256 --set codebook.image_size=256 \
    --set codebook.num_queries=16 \
    --set codebook.train.num_steps="$steps" --set codebook.train.checkpoint_every=250 \
    --set run.allow_config_change=true   # each round changes num_steps on purpose (logged in config_changes.jsonl)
  cp "$WORKDIR/codebook/report.json" "$WORKDIR/report_$steps.json"
done
