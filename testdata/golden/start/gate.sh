#!/bin/sh
# dispatch Start: job 01JZ8Q2N5V0000000000000007 generation 1 submission 1 attempt 0
set -eu
D="$HOME"/.dispatch/output/01JZ8Q2N5V0000000000000007
[ -d "$D" ] || mkdir -p -- "$D"
printf '%s\n' '{"version": 1, "stdout": {"prefix": "s1-", "suffix": ".out"}, "stderr": {"prefix": "s1-", "suffix": ".err"}}' >"$D/s1.manifest"
sbatch --parsable \
  --job-name=dj-01JZ8Q2N5V0000000000000007 \
  '--comment=dispatch:s=1;a=0' \
  --hold \
  --export=NIL \
  --chdir=/home/alice \
  "--output=$D/s1-%j.slurm" \
  "--error=$D/s1-%j.slurm" \
  --open-mode=append \
  --no-requeue \
  /dev/stdin \
  "$D" \
  "${PATH+=}${PATH-}" <<'DISPATCH_EOF'
#!/bin/sh
# arguments: the output directory, then per environment.pass variable (PATH) =value, or empty when unset on the host
DISPATCH_JOB_ID=01JZ8Q2N5V0000000000000007
DISPATCH_SUBMISSION=1
case ${SLURM_JOB_ID:-} in
''|*[!0-9]*) printf 'dispatch: SLURM_JOB_ID=%s is not a job id\n' "${SLURM_JOB_ID:-}" >&2; exit 125 ;;
esac
R=${SLURM_RESTART_COUNT:-0}
case $R in
0|[1-9]|[1-9][0-9]|[1-9][0-9][0-9]|[1-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9][0-9]) ;;
*) printf 'dispatch: SLURM_RESTART_COUNT=%s is not a restart count below 1000000\n' "$R" >&2; exit 125 ;;
esac
DISPATCH_ATTEMPT=s1-${SLURM_JOB_ID}-r${R}
DISPATCH_EPOCH=$((1 * 1000000 + R))
export DISPATCH_JOB_ID DISPATCH_SUBMISSION DISPATCH_ATTEMPT DISPATCH_EPOCH
exec >>"$1/s1-${SLURM_JOB_ID}-r${R}.out" 2>>"$1/s1-${SLURM_JOB_ID}-r${R}.err"
case ${2} in =*) PATH=${2#=}; export PATH ;; *) unset PATH ;; esac
export SLURM_EXPORT_ENV=ALL
exec /usr/bin/hostname
DISPATCH_EOF
