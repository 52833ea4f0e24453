# shellcheck shell=bash
# slurm-version.sh: the --version option of scripts/slurm-up, slurm-down and slurm-ctl.
# Sourced by them (it defines one function and runs nothing).
#
#   ds_version_hook CMD "$@"
#
# Takes `--version V` / `--version=V` out of the arguments. V = 22.05 (the default: the
# host's own Debian 12 packages) leaves the caller to go on with the other arguments,
# which it finds in the array DS_ARGS. V = 24.11 or 26.05 replaces the caller with
# `scripts/slurm-chroot CMD V ARGS...` (a cluster in a Debian root filesystem of its
# own); CMD "-" means the first of the other arguments is the command (slurm-ctl).

ds_version_hook() {
  local cmd=$1 version=22.05 here
  shift
  DS_ARGS=()
  while (($#)); do
    case $1 in
      --version) version=${2?--version needs a value: 22.05, 24.11 or 26.05}; shift 2 ;;
      --version=*) version=${1#*=}; shift ;;
      *) DS_ARGS+=("$1"); shift ;;
    esac
  done
  case $version in
    22.05) return 0 ;;
    24.11 | 26.05)
      here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
      if [[ $cmd == - ]]; then
        ((${#DS_ARGS[@]})) || { echo "usage: slurm-ctl --version $version check|status|stop|start|restart [DAEMON]" >&2; exit 2; }
        cmd=${DS_ARGS[0]}
        DS_ARGS=("${DS_ARGS[@]:1}")
      fi
      exec "$here/../slurm-chroot" "$cmd" "$version" "${DS_ARGS[@]}"
      ;;
    *)
      echo "--version must be 22.05, 24.11 or 26.05, not '$version'" >&2
      exit 2
      ;;
  esac
}
