#!/usr/bin/env bash
# One host, all its GPUs (the paper's 8 x H100 node), one process; the mesh comes from the config
# (fsdp: -1 = every local device).
#   launch/gpu_single_host.sh [--dry-run] STAGE CONFIG WORKDIR [--set k=v ...]
set -euo pipefail
# shellcheck source=launch/_common.sh
source "$(dirname "$0")/_common.sh" "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
stage=${1:?usage: gpu_single_host.sh [--dry-run] STAGE CONFIG WORKDIR [--set k=v ...]} config=${2:?config} workdir=${3:?workdir}
shift 3
config_args "$config"
flags=(
  # Overlap the FSDP all-gathers / reduce-scatters with compute instead of running them in sequence.
  --xla_gpu_enable_latency_hiding_scheduler=true
  # Combine the per-layer collectives into ~128 MiB transfers: many small NCCL calls waste NVLink time.
  --xla_gpu_all_gather_combine_threshold_bytes=134217728
  --xla_gpu_reduce_scatter_combine_threshold_bytes=134217728
  --xla_gpu_all_reduce_combine_threshold_bytes=134217728
  # Quick checks of a new config only: without GEMM autotuning the first step compiles much faster but every
  # step runs slower (BENCHMARKS.md, section "GRPO step on a GPU", "The first step's compile"). Reruns load XLA's
  # compilation cache.
  # --xla_gpu_autotune_level=0
)
# Leave ~8 % of HBM to cuDNN / NCCL workspaces outside XLA's preallocated pool.
mem=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
run "XLA_FLAGS=${XLA_FLAGS:-} ${flags[*]}" "XLA_PYTHON_CLIENT_MEM_FRACTION=$mem" -- \
  "${PYTHON:-python}" -m dlr_jax.train --stage "$stage" ${CFG_ARGS[@]+"${CFG_ARGS[@]}"} --workdir "$workdir" "$@"
