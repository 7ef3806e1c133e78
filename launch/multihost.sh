#!/usr/bin/env bash
# One process per host, every host runs this with its own DLR_PROCESS_ID (0 .. N-1):
#   DLR_COORDINATOR=host0:1234 DLR_NUM_PROCESSES=N DLR_PROCESS_ID=i \
#     launch/multihost.sh [--dry-run] STAGE CONFIG WORKDIR [--set k=v ...]
# The workdir must be a path every host sees on a shared filesystem (NFS, Filestore, Lustre, a bucket mounted
# with gcsfuse): the code reads and writes plain paths, so a gs:// URL is not understood.
set -euo pipefail
# shellcheck source=launch/_common.sh
source "$(dirname "$0")/_common.sh" "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
: "${DLR_COORDINATOR:?set DLR_COORDINATOR=host:port of process 0}"
: "${DLR_NUM_PROCESSES:?set DLR_NUM_PROCESSES}"
: "${DLR_PROCESS_ID:?set DLR_PROCESS_ID}"
stage=${1:?usage: multihost.sh [--dry-run] STAGE CONFIG WORKDIR [--set k=v ...]} config=${2:?config} workdir=${3:?workdir}
shift 3
config_args "$config"
run "DLR_COORDINATOR=$DLR_COORDINATOR" "DLR_NUM_PROCESSES=$DLR_NUM_PROCESSES" "DLR_PROCESS_ID=$DLR_PROCESS_ID" \
  "XLA_FLAGS=${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true" -- \
  "${PYTHON:-python}" -m dlr_jax.train --stage "$stage" ${CFG_ARGS[@]+"${CFG_ARGS[@]}"} --workdir "$workdir" "$@"
