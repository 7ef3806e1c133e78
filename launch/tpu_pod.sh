#!/usr/bin/env bash
# A Cloud TPU pod slice: the same command on every worker (JAX finds the pod's processes itself).
#   TPU_NAME=my-pod ZONE=us-east5-a launch/tpu_pod.sh [--dry-run] STAGE CONFIG /mnt/shared/workdir [--set ...]
set -euo pipefail
# shellcheck source=launch/_common.sh
source "$(dirname "$0")/_common.sh" "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
stage=${1:?usage: tpu_pod.sh [--dry-run] STAGE CONFIG WORKDIR [--set ...]} config=${2:?config} workdir=${3:?workdir}
shift 3
quote() { [ "$#" -eq 0 ] || printf '%q ' "$@"; }  # printf alone would print '' for no arguments
extra=$(quote "$@")
config_args "$config"
cfg=$(quote ${CFG_ARGS[@]+"${CFG_ARGS[@]}"})
remote="cd ~/dlr_jax && python -m dlr_jax.train --stage $(quote "$stage")$cfg--workdir $(quote "$workdir")--set mesh.rules=tpu $extra"
run -- gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command "$remote"
