cd -- /tmp/o 2>/dev/null || exit 0
for f in s3-*; do
 [ -f "$f" ] || continue
 case $f in *"
"*) continue ;; esac
 off=0
 case $f in
  s3-9) off=5 ;;
 esac
 size=$(wc -c <"$f") || continue
 n=$((size - off))
 [ "$n" -gt 4194304 ] && n=4194304
 [ "$n" -lt 0 ] && n=0
 printf '%s %s %s\n' "$off" "$n" "$f"
 if [ "$n" -gt 0 ]; then tail -c +$((off + 1)) -- "$f" | head -c "$n" | base64 | tr -d '\n'; fi
 printf '\n'
done
