# Sourced by the launch scripts: `--dry-run` as the first argument prints the resolved commands
# (environment included) instead of running them.
# shellcheck shell=bash
DRY_RUN=${DRY_RUN:-0}
if [ "${1:-}" = "--dry-run" ]; then
  DRY_RUN=1
  shift
fi
# -h / --help (after --dry-run too): the script's own header (its comment lines after the shebang), then stop
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^[^#]/{/^#[^!S]/s/^# \{0,1\}//p;/^#$/s/^#//p}' "$0"
  exit 0
fi
# shellcheck disable=SC2034  # read by the sourcing script
ARGS=("$@")

# run VAR=value ... -- cmd args...: exports the variables, then execs (or prints) the command.
run() {
  local envs=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if [ "$DRY_RUN" = 1 ]; then
    [ "${#envs[@]}" -gt 0 ] && printf '%q ' "${envs[@]}"
    printf '%q ' "$@"
    printf '\n'
    return 0
  fi
  local kv
  for kv in ${envs[@]+"${envs[@]}"}; do export "${kv?}"; done
  "$@"
}

# config_args CONFIG: CFG_ARGS=(--config CONFIG), or none for "-" (the config the workdir recorded at its first stage,
# which a later stage reads when --config is left out).
config_args() {
  CFG_ARGS=()
  # shellcheck disable=SC2034  # read by the sourcing script
  [ "$1" = - ] || CFG_ARGS=(--config "$1")
}
