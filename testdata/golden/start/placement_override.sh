#!/bin/sh
# dispatch Start: job 01JZ8Q2N5V0000000000000003 generation 1 submission 2 attempt 1
set -eu
D=/shared/dispatch/output/01JZ8Q2N5V0000000000000003
[ -d "$D" ] || mkdir -p -- "$D"
printf '%s\n' '{"version": 1, "stdout": {"prefix": "s2-", "suffix": ".out"}, "stderr": {"prefix": "s2-", "suffix": ".err"}}' >"$D/s2.manifest"
sbatch --parsable \
  --job-name=dj-01JZ8Q2N5V0000000000000003 \
  '--comment=dispatch:s=2;a=1' \
  --export=NIL \
  --chdir=/home/alice/resnet \
  "--output=$D/s2-%j.slurm" \
  "--error=$D/s2-%j.slurm" \
  --open-mode=append \
  --nodes=1 \
  --gpus-per-node=4 \
  --mem=64000 \
  --time=1440 \
  --no-requeue \
  --partition=gpu \
  --account=physics \
  --qos=high \
  --constraint=skylake \
  --exclude=gpu07 \
  /dev/stdin \
  "$D" \
  "${PATH+=}${PATH-}" \
  "${HOME+=}${HOME-}" \
  "${LANG+=}${LANG-}" <<'DISPATCH_EOF'
#!/bin/sh
# arguments: the output directory, then per environment.pass variable (PATH HOME LANG) =value, or empty when unset on the host
DISPATCH_JOB_ID=01JZ8Q2N5V0000000000000003
DISPATCH_SUBMISSION=2
case ${SLURM_JOB_ID:-} in
''|*[!0-9]*) printf 'dispatch: SLURM_JOB_ID=%s is not a job id\n' "${SLURM_JOB_ID:-}" >&2; exit 125 ;;
esac
R=${SLURM_RESTART_COUNT:-0}
case $R in
0|[1-9]|[1-9][0-9]|[1-9][0-9][0-9]|[1-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9][0-9]) ;;
*) printf 'dispatch: SLURM_RESTART_COUNT=%s is not a restart count below 1000000\n' "$R" >&2; exit 125 ;;
esac
DISPATCH_ATTEMPT=s2-${SLURM_JOB_ID}-r${R}
DISPATCH_EPOCH=$((2 * 1000000 + R))
export DISPATCH_JOB_ID DISPATCH_SUBMISSION DISPATCH_ATTEMPT DISPATCH_EPOCH
exec >>"$1/s2-${SLURM_JOB_ID}-r${R}.out" 2>>"$1/s2-${SLURM_JOB_ID}-r${R}.err"
case ${2} in =*) PATH=${2#=}; export PATH ;; *) unset PATH ;; esac
case ${3} in =*) HOME=${3#=}; export HOME ;; *) unset HOME ;; esac
case ${4} in =*) LANG=${4#=}; export LANG ;; *) unset LANG ;; esac
export SLURM_EXPORT_ENV=ALL
export OMP_NUM_THREADS=8
exec python3 train.py --epochs 90 --data /data/imagenet
DISPATCH_EOF
