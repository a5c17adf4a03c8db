#!/bin/sh
# Wall time of `cachepilot-sim --help`, one config error and one mistyped tool name, three runs
# each (the median printed, then every run), and the load average: a record, not a timed test.
#   PY=.venv/bin/python sh experiments/bench_cli_startup.sh
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-python}
t() {
    s=$(date +%s.%N)
    PYTHONPATH=$PWD $PY -c "import sys; sys.argv=['cachepilot-sim']+sys.argv[1:]; \
from cachepilot_sim.tools.cli import main; main()" "$@" >/dev/null 2>&1
    e=$(date +%s.%N)
    echo "$e - $s" | bc
}
echo "commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
for case in "--help" "vram_gb=-1" "plann"; do
    a=$(t $case); b=$(t $case); c=$(t $case)
    echo "$case: median $(printf '%s\n' "$a" "$b" "$c" | sort -n | sed -n 2p) s (runs: $a $b $c)"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
