#!/usr/bin/env bash
# SLURM, several 8-GPU nodes, one process per node:
#   sbatch --nodes=2 launch/slurm.sh STAGE CONFIG WORKDIR [--set k=v ...]     # from the repository root
#   launch/slurm.sh --dry-run STAGE CONFIG WORKDIR     # prints each node's command (uses $SLURM_* if set)
#SBATCH --job-name=dlr_jax
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
set -euo pipefail
here=$(dirname "$0")
# sbatch runs a copy of this script from slurmd's spool directory, without its neighbours: find them in the
# checkout it was submitted from (submit from the repository root, as `sbatch launch/slurm.sh ...`)
if [ ! -f "$here/_common.sh" ] && [ -n "${SLURM_SUBMIT_DIR:-}" ]; then
  here=$SLURM_SUBMIT_DIR/launch
  [ -f "$here/_common.sh" ] || { echo "slurm.sh: no $here/_common.sh: run sbatch from the repository root" >&2; exit 2; }
fi
# shellcheck source=launch/_common.sh
source "$here/_common.sh" "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
stage=${1:?usage: slurm.sh [--dry-run] STAGE CONFIG WORKDIR [--set k=v ...]} config=${2:?config} workdir=${3:?workdir}
shift 3
nodes=${SLURM_JOB_NODELIST:-localhost}
if command -v scontrol >/dev/null 2>&1 && [ -n "${SLURM_JOB_NODELIST:-}" ]; then
  head=$(scontrol show hostnames "$nodes" | head -n 1)
elif [ -n "${DLR_COORDINATOR:-}" ]; then
  head=${DLR_COORDINATOR%:*}
  DLR_PORT=${DLR_PORT:-${DLR_COORDINATOR##*:}}
elif [[ $nodes == *[* ]]; then  # a compressed list (gpu[07-09]) needs scontrol to expand
  echo "slurm.sh: cannot expand SLURM_JOB_NODELIST=$nodes without scontrol; set DLR_COORDINATOR=host:port" >&2
  exit 2
else
  head=${nodes%%,*}
fi
port=${DLR_PORT:-12345}
ntasks=${SLURM_NTASKS:-1}
if [ "$DRY_RUN" = 1 ]; then
  for ((i = 0; i < ntasks; i++)); do
    DLR_COORDINATOR="$head:$port" DLR_NUM_PROCESSES=$ntasks DLR_PROCESS_ID=$i \
      bash "$here/multihost.sh" --dry-run "$stage" "$config" "$workdir" "$@"
  done
  exit 0
fi
# srun starts one task per node; each reads its rank from SLURM_PROCID (expanded by the task's shell).
export DLR_COORDINATOR="$head:$port" DLR_NUM_PROCESSES=$ntasks
# shellcheck disable=SC2016
srun --kill-on-bad-exit=1 bash -c 'DLR_PROCESS_ID=$SLURM_PROCID exec bash "$0" "${@}"' \
  "$here/multihost.sh" "$stage" "$config" "$workdir" "$@"
