#!/usr/bin/env bash
# Trace steps A:B of a stage with jax.profiler (and optionally dump XLA's HLO), without touching WORKDIR:
#   launch/profile.sh [--dry-run] STAGE CONFIG WORKDIR [A:B] [--set k=v ...]    # default steps 10:15
# STAGE: textsft (with --mode cot, direct or direct_from_cot: one run), codebook, align, sft or rl. CONFIG: a
# YAML file, or - for the config WORKDIR recorded.
# The stage runs in a scratch workdir, WORKDIR.profile-STAGE (PROFILE_DIR overrides it), that links WORKDIR's
# other entries (the earlier stages it starts from) and copies its config.yaml: the stage trains from its start to
# step B + 1 there and finishes there, so WORKDIR's own stage (checkpoints, final model) is never written. A rerun
# starts it afresh (the previous profile's stage dir and config copy are replaced).
# The trace lands in <scratch>/<stage dir>/profile/plugins/profile/<run>/*.xplane.pb. Open it with
#   pip install xprof && xprof --logdir <scratch>/<stage dir>/profile --port 8791   (then http://localhost:8791)
# or TensorBoard's profile plugin (tensorboard --logdir ...), or https://ui.perfetto.dev for the trace.json.gz.
# DUMP_HLO=1 also writes XLA's optimised HLO of every compiled program to <scratch>/xla_dump.
# A real run traces without the scratch copy too: --set train.<stage>.profile_steps=A:B (codebook.train.profile_steps).
set -euo pipefail
# shellcheck source=launch/_common.sh
source "$(dirname "$0")/_common.sh" "$@"
set -- ${ARGS[@]+"${ARGS[@]}"}
stage=${1:?usage: profile.sh [--dry-run] STAGE CONFIG WORKDIR [A:B]} config=${2:?config} workdir=${3:?workdir}
shift 3
steps=10:15
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+:[0-9]+$ ]]; then steps=$1; shift; fi
end=${steps#*:}
mode=both  # textsft's --mode, if given: which runs train (and are traced) and which are linked
prev=
for a in "$@"; do [ "$prev" = --mode ] && mode=$a; prev=$a; done
case $stage in
  textsft)
    case $mode in
      cot) section=train.textsft; own=(textsft_cot) ;;
      direct | direct_from_cot) section=train.textsft_direct; own=(textsft_direct) ;;
      *) echo "profile.sh: textsft traces one run: add --mode cot, direct or direct_from_cot" >&2; exit 2 ;;
    esac ;;
  codebook) section=codebook.train; own=(codebook) ;;
  align | sft | rl) section=train.$stage; own=("$stage") ;;
  *) echo "profile.sh: STAGE must be textsft, codebook, align, sft or rl (a training loop), got '$stage'" >&2; exit 2 ;;
esac
while [ "${workdir%/}" != "$workdir" ] && [ "$workdir" != / ]; do workdir=${workdir%/}; done
scratch=${PROFILE_DIR:-$workdir.profile-$stage}
if [ -d "$workdir" ] && [ -d "$scratch" ] && [ "$(cd "$scratch" && pwd -P)" = "$(cd "$workdir" && pwd -P)" ]; then
  echo "profile.sh: PROFILE_DIR is the workdir itself; it must be a scratch directory" >&2
  exit 2
fi
config_args "$config"
if [ "$config" = - ] && [ "$DRY_RUN" = 0 ] && [ ! -f "$workdir/config.yaml" ]; then
  echo "profile.sh: CONFIG - needs $workdir/config.yaml" >&2
  exit 2
fi
run -- mkdir -p "$scratch"
# every run starts the stage afresh from the workdir as it is now: the previous profile's stage and config go
for o in "${own[@]}"; do
  if [ -e "$scratch/$o" ] || [ -L "$scratch/$o" ]; then run -- rm -rf "${scratch:?}/$o"; fi
done
if [ -e "$scratch/config.yaml" ]; then run -- rm -f "$scratch/config.yaml" "$scratch/config_changes.jsonl"; fi
if [ -d "$workdir" ]; then
  for entry in "$workdir"/*; do
    [ -e "$entry" ] || continue
    name=$(basename "$entry")
    skip=0
    for o in "${own[@]}" xla_dump config_changes.jsonl; do [ "$name" = "$o" ] && skip=1; done
    if [ "$name" = config.yaml ]; then
      run -- cp "$entry" "$scratch/config.yaml"
    elif [ "$skip" = 0 ]; then
      run -- ln -sfn "$(cd "$workdir" && pwd)/$name" "$scratch/$name"
    fi
  done
fi
xla=${XLA_FLAGS:-}
if [ "${DUMP_HLO:-0}" = 1 ]; then xla="$xla --xla_dump_to=$scratch/xla_dump --xla_dump_hlo_as_text"; fi
run "XLA_FLAGS=$xla" -- "${PYTHON:-python}" -m dlr_jax.train --stage "$stage" ${CFG_ARGS[@]+"${CFG_ARGS[@]}"} \
  --workdir "$scratch" --set "$section.profile_steps=$steps" --steps "$((end + 1))" "$@"
[ "$DRY_RUN" = 1 ] || echo "trace written under $scratch/*/profile: xprof --logdir <that dir> (pip install xprof)"
