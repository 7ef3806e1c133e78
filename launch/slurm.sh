#!/usr/bin/env bash
# Usage: sbatch --nodes=N --ntasks-per-node=1 --gpus-per-node=8 launch/slurm.sh STAGE CONFIG WORKDIR [--set k=v ...]
# One process per node; the first node of the allocation is the coordinator. WORKDIR must be on
# storage every node sees.
set -euo pipefail
stage=$1 config=$2 workdir=$3; shift 3
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export DLR_COORDINATOR="$head:${DLR_PORT:-12355}" DLR_NUM_PROCESSES="$SLURM_NTASKS"
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
# DLR_PROCESS_ID differs per task: expanded by each task's shell, not here.
exec srun bash -c 'DLR_PROCESS_ID=$SLURM_PROCID exec python -m dlr_jax.train "$@"' _ \
  --stage "$stage" --config "$config" --workdir "$workdir" "$@"
