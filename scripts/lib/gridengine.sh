# shellcheck shell=bash
# gridengine.sh: paths and helpers shared by scripts/gridengine-up and
# scripts/gridengine-down (the local test Grid Engine: Debian 12's Son of Grid
# Engine 8.1.9). Sourced: it defines variables and ge_* functions and runs nothing.
# shellcheck disable=SC2034 # the GE_* paths are used by the scripts that source this

# ---------------------------------------------------------------- layout
# Debian's packages fix these (debconf, /etc/default/gridengine, the cell's
# bootstrap file); the client commands in /usr/bin are wrappers that set
# SGE_ROOT and SGE_CELL themselves, so plain `qsub` works for every user.
GE_ROOT=/var/lib/gridengine
GE_CELL=default
GE_COMMON=$GE_ROOT/$GE_CELL/common
GE_ACCOUNTING=$GE_COMMON/accounting
GE_QMASTER_SPOOL=/var/spool/gridengine/qmaster    # messages, qmaster.pid, jobseqnum
GE_EXECD_SPOOL=/var/spool/gridengine/execd        # <host>/messages, <host>/execd.pid
GE_SPOOLDB=/var/spool/gridengine/spooldb          # BerkeleyDB spool of qmaster
# Ours: the configuration files we hand to qconf, the env file, the daemons' stdout.
GE_BASE=/var/lib/dispatch-gridengine
GE_CONF=$GE_BASE/conf
GE_LOG=$GE_BASE/log
GE_ENV=$GE_BASE/env
GE_LOCK=/run/lock/dispatch-gridengine.lock
GE_QUEUE=dispatch.q
GE_PE=smp
GE_SUBMIT_USER=dispatch        # the same ordinary users as scripts/slurm-up
GE_OTHER_USER=dispatch-other

export SGE_ROOT=$GE_ROOT SGE_CELL=$GE_CELL

ge_log() { printf '%s: %s\n' "${GE_PROG:-gridengine}" "$*" >&2; }

ge_die() {
  ge_log "ERROR: $*"
  exit 1
}

ge_need_root() {
  [[ $(id -u) -eq 0 ]] || ge_die "must run as root"
}

# Take the lock shared by gridengine-up and gridengine-down (fd 8; the Slurm
# scripts use fd 9 and a lock of their own).
ge_lock() {
  mkdir -p "$(dirname "$GE_LOCK")"
  exec 8>"$GE_LOCK"
  flock -w 300 8 || ge_die "could not take $GE_LOCK within 300 s (another gridengine-up/down run?)"
}

# Seconds since the epoch, with fractions.
ge_now() { printf '%s' "$EPOCHREALTIME"; }

ge_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}'; }

# Poll command "$@" every 0.2 s until it succeeds or $timeout seconds pass.
ge_wait_for() {
  local timeout=$1
  shift
  local deadline=$((EPOCHSECONDS + timeout))
  until "$@"; do
    ((EPOCHSECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# True when process $1 exists and its command name is $2, and it is not a
# zombie, or a zombie only in its main thread: qmaster's main thread ends first
# at shutdown, the others take seconds more (and PID 1 here reaps slowly).
ge_pid_alive() {
  local pid=$1 comm=$2 stat rest tasks
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
  rest=${stat##*) }
  [[ ${rest%% *} != [ZX] ]] && return 0
  tasks=(/proc/"$pid"/task/*)
  ((${#tasks[@]} > 1))
}

# The pid files. qmaster writes $GE_QMASTER_SPOOL/qmaster.pid; execd writes
# execd.pid in its spool directory, named after the host as the resolver gives
# it back *before* host_aliases (on this machine "localhost", not the hostname).
ge_pidfiles() {
  case $1 in
    sge_qmaster) echo "$GE_QMASTER_SPOOL/qmaster.pid" ;;
    sge_execd) compgen -G "$GE_EXECD_SPOOL/*/execd.pid" || true ;;
    *) ge_die "unknown daemon '$1'" ;;
  esac
}

# Print the pid of the running daemon $1 (sge_qmaster or sge_execd); fail when none runs.
ge_daemon_pid() {
  local f pid
  while read -r f; do
    [[ -n $f && -r $f ]] || continue
    read -r pid <"$f" 2>/dev/null || continue
    if ge_pid_alive "$pid" "$1"; then
      echo "$pid"
      return 0
    fi
  done < <(ge_pidfiles "$1")
  return 1
}

ge_running() { ge_daemon_pid "$1" >/dev/null; }

ge_qmaster_ok() { timeout 10 qconf -sh >/dev/null 2>&1; }

ge_tail_log() {
  local f
  for f in "$@"; do
    if [[ -r $f ]]; then
      ge_log "last lines of $f:"
      tail -n 15 "$f" >&2 || true
    fi
  done
}

ge_execd_logs() { compgen -G "$GE_EXECD_SPOOL/*/messages" || true; }

# Stop daemon $1 (sge_qmaster or sge_execd of host $2): politely through qmaster
# when it answers (qconf -km / -ke: running jobs are left running, their
# shepherds do not depend on execd), else SIGTERM; SIGKILL after 30 s.
ge_stop() {
  local name=$1 host=${2:-} pid
  pid=$(ge_daemon_pid "$name") || return 0
  ge_log "stopping $name (pid $pid)"
  case $name in
    sge_qmaster) timeout 10 qconf -km >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true ;;
    sge_execd) timeout 10 qconf -ke "$host" >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true ;;
  esac
  local deadline=$((EPOCHSECONDS + 30))
  while ge_pid_alive "$pid" "$name"; do
    if ((EPOCHSECONDS >= deadline)); then
      ge_log "$name (pid $pid) still runs after 30 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.2
  done
}
