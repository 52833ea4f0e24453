[ -e /srv/a/s1-7.slurm ] || echo 0
[ -e "$HOME"/'b c/s2-8.slurm' ] || echo 1
[ -e '/srv/it'"'"'s; rm -rf x' ] || echo 2
[ -e "$HOME" ] || echo 3
