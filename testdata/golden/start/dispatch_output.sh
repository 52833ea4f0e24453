#!/bin/sh
# dispatch Start: job 01JZ8Q2N5V0000000000000006 generation 1 submission 7 attempt 0
set -eu
D="$HOME"/.dispatch/output/01JZ8Q2N5V0000000000000006
[ -d "$D" ] && [ -d /srv/logs ] && [ -d /srv/errors ] || mkdir -p -- "$D" /srv/logs /srv/errors
printf '%s\n' '{"version": 1, "stdout": {"prefix": "/srv/logs/build stdout.log.s7-", "suffix": ""}, "stderr": {"prefix": "/srv/errors/build.err.s7-", "suffix": ""}}' >"$D/s7.manifest"
sbatch --parsable \
  --job-name=dj-01JZ8Q2N5V0000000000000006 \
  '--comment=dispatch:s=7;a=0' \
  --export=NIL \
  --chdir=/srv/build \
  "--output=$D/s7-%j.slurm" \
  "--error=$D/s7-%j.slurm" \
  --open-mode=append \
  --no-requeue \
  /dev/stdin \
  "$D" \
  "${PATH+=}${PATH-}" <<'DISPATCH_EOF'
#!/bin/sh
# arguments: the output directory, then per environment.pass variable (PATH) =value, or empty when unset on the host
DISPATCH_JOB_ID=01JZ8Q2N5V0000000000000006
DISPATCH_SUBMISSION=7
case ${SLURM_JOB_ID:-} in
''|*[!0-9]*) printf 'dispatch: SLURM_JOB_ID=%s is not a job id\n' "${SLURM_JOB_ID:-}" >&2; exit 125 ;;
esac
R=${SLURM_RESTART_COUNT:-0}
case $R in
0|[1-9]|[1-9][0-9]|[1-9][0-9][0-9]|[1-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9][0-9]) ;;
*) printf 'dispatch: SLURM_RESTART_COUNT=%s is not a restart count below 1000000\n' "$R" >&2; exit 125 ;;
esac
DISPATCH_ATTEMPT=s7-${SLURM_JOB_ID}-r${R}
DISPATCH_EPOCH=$((7 * 1000000 + R))
export DISPATCH_JOB_ID DISPATCH_SUBMISSION DISPATCH_ATTEMPT DISPATCH_EPOCH
exec >>'/srv/logs/build stdout.log.s7-'"${SLURM_JOB_ID}-r${R}" 2>>/srv/errors/build.err.s7-"${SLURM_JOB_ID}-r${R}"
case ${2} in =*) PATH=${2#=}; export PATH ;; *) unset PATH ;; esac
export SLURM_EXPORT_ENV=ALL
exec make all
DISPATCH_EOF
