#!/usr/bin/env bash
# Trace steps A:B of a stage with jax.profiler (and optionally dump XLA's HLO):
#   launch/profile.sh [--dry-run] STAGE CONFIG WORKDIR [A:B] [--set k=v ...]    # default steps 10:15
# The trace lands in WORKDIR/<stage dir>/profile/plugins/profile/<run>/*.xplane.pb. Open it with
#   pip install xprof && xprof --logdir WORKDIR/<stage dir>/profile --port 8791     (then http://localhost:8791)
# or TensorBoard's profile plugin (tensorboard --logdir ...), or https://ui.perfetto.dev for the trace.json.gz.
# DUMP_HLO=1 also writes XLA's optimised HLO of every compiled program to WORKDIR/xla_dump.
set -euo pipefail
# shellcheck source=launch/_common.sh
source "$(dirname "$0")/_common.sh" "$@"
set -- "${ARGS[@]}"
stage=${1:?usage: profile.sh [--dry-run] STAGE CONFIG WORKDIR [A:B]} config=${2:?config} workdir=${3:?workdir}
shift 3
steps=10:15
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+:[0-9]+$ ]]; then steps=$1; shift; fi
end=${steps#*:}
section=$stage
[ "$stage" = textsft ] && section=textsft
[ "$stage" = codebook ] && section=codebook.train
[ "$stage" = codebook ] || section="train.$section"
xla=${XLA_FLAGS:-}
if [ "${DUMP_HLO:-0}" = 1 ]; then xla="$xla --xla_dump_to=$workdir/xla_dump --xla_dump_hlo_as_text"; fi
run "XLA_FLAGS=$xla" -- "${PYTHON:-python}" -m dlr_jax.train --stage "$stage" --config "$config" \
  --workdir "$workdir" --set "$section.profile_steps=$steps" --steps "$((end + 1))" "$@"
[ "$DRY_RUN" = 1 ] || echo "trace written under $workdir/*/profile: xprof --logdir <that dir> (pip install xprof)"
