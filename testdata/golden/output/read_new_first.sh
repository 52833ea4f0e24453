cd -- /srv/dispatch/out/01J0000000000000000000000A 2>/dev/null || exit 0
for f in s1-*.out; do
 [ -f "$f" ] || continue
 case $f in *"
"*) continue ;; esac
 off=0
 size=$(wc -c <"$f") || continue
 n=$((size - off))
 [ "$n" -gt 4194304 ] && n=4194304
 [ "$n" -lt 0 ] && n=0
 printf '%s %s %s\n' "$off" "$n" "$f"
 if [ "$n" -gt 0 ]; then tail -c +$((off + 1)) -- "$f" | head -c "$n" | base64 | tr -d '\n'; fi
 printf '\n'
done
