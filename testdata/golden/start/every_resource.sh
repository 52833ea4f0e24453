#!/bin/sh
# dispatch Start: job 01JZ8Q2N5V0000000000000001 generation 1 submission 12 attempt 3
set -eu
D="$HOME"/.dispatch/output/01JZ8Q2N5V0000000000000001
[ -d "$D" ] || mkdir -p -- "$D"
printf '%s\n' '{"version": 1, "stdout": {"prefix": "s12-", "suffix": ".out"}, "stderr": {"prefix": "s12-", "suffix": ".err"}}' >"$D/s12.manifest"
sbatch --parsable \
  --job-name=dj-01JZ8Q2N5V0000000000000001 \
  '--comment=dispatch:s=12;a=3' \
  --export=NIL \
  --chdir=/scratch/sim \
  "--output=$D/s12-%j.slurm" \
  "--error=$D/s12-%j.slurm" \
  --open-mode=append \
  --nodes=4 \
  --ntasks-per-node=8 \
  --cpus-per-task=2 \
  --gpus-per-node=2 \
  --mem=32768 \
  --time=61 \
  --no-requeue \
  --gres=gpu:a100:2,nvme:1 \
  --licenses=matlab:1 \
  --tmp=10240 \
  --time-min=30 \
  /dev/stdin \
  "$D" \
  "${PATH+=}${PATH-}" <<'DISPATCH_EOF'
#!/bin/sh
# arguments: the output directory, then per environment.pass variable (PATH) =value, or empty when unset on the host
DISPATCH_JOB_ID=01JZ8Q2N5V0000000000000001
DISPATCH_SUBMISSION=12
case ${SLURM_JOB_ID:-} in
''|*[!0-9]*) printf 'dispatch: SLURM_JOB_ID=%s is not a job id\n' "${SLURM_JOB_ID:-}" >&2; exit 125 ;;
esac
R=${SLURM_RESTART_COUNT:-0}
case $R in
0|[1-9]|[1-9][0-9]|[1-9][0-9][0-9]|[1-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9][0-9]) ;;
*) printf 'dispatch: SLURM_RESTART_COUNT=%s is not a restart count below 1000000\n' "$R" >&2; exit 125 ;;
esac
DISPATCH_ATTEMPT=s12-${SLURM_JOB_ID}-r${R}
DISPATCH_EPOCH=$((12 * 1000000 + R))
export DISPATCH_JOB_ID DISPATCH_SUBMISSION DISPATCH_ATTEMPT DISPATCH_EPOCH
exec >>"$1/s12-${SLURM_JOB_ID}-r${R}.out" 2>>"$1/s12-${SLURM_JOB_ID}-r${R}.err"
case ${2} in =*) PATH=${2#=}; export PATH ;; *) unset PATH ;; esac
export SLURM_EXPORT_ENV=ALL
exec /opt/sim/bin/run --steps 1000
DISPATCH_EOF
