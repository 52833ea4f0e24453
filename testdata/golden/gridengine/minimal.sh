#!/bin/sh
# dispatch Start (Grid Engine): job 01JZ8Q2N5V0000000000000000 generation 3 submission 2 attempt 1
set -eu
D="$HOME"/.dispatch/output/01JZ8Q2N5V0000000000000000
[ -d "$D" ] || mkdir -p -- "$D"
printf '%s\n' '{"version": 1, "stdout": {"prefix": "s2-", "suffix": ".out"}, "stderr": {"prefix": "s2-", "suffix": ".err"}}' >"$D/s2.manifest"
cat >"$D/s2.job" <<'DISPATCH_EOF'
#!/bin/sh
# arguments: the output directory, then per environment.pass variable (PATH) =value, or empty when unset
DISPATCH_JOB_ID=01JZ8Q2N5V0000000000000000
DISPATCH_SUBMISSION=2
case ${JOB_ID:-} in
''|*[!0-9]*) printf 'dispatch: JOB_ID=%s is not a job id\n' "${JOB_ID:-}" >&2; exit 125 ;;
esac
case ${RESTARTED:-0} in 1) R=1 ;; *) R=0 ;; esac
DISPATCH_ATTEMPT=s2-${JOB_ID}-r${R}
DISPATCH_EPOCH=$((2 * 1000000 + R))
export DISPATCH_JOB_ID DISPATCH_SUBMISSION DISPATCH_ATTEMPT DISPATCH_EPOCH
exec >>"$1/s2-${JOB_ID}-r${R}.out" 2>>"$1/s2-${JOB_ID}-r${R}.err"
case ${2} in =*) PATH=${2#=}; export PATH ;; *) unset PATH ;; esac
exec python3 -c 'print('"'"'hi'"'"')'
DISPATCH_EOF
J=$(qsub -terse -N dj-01JZ8Q2N5V0000000000000000 -A 'dispatch;s=2;a=1' -h -S /bin/sh -wd /home/dispatch/w -j y -o "$D/s2-\$JOB_ID.ge" -r n "$D/s2.job" "$D" "${PATH+=}${PATH-}")
printf 'DISPATCH_ID %s\n' "$J"
exec qstat -j "$J" -xml
