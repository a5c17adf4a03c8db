#!/bin/bash
# every 60 s: UTC, RSS/HWM of the simulation process, its CPU time, request/trace parts, load
while true; do
  pid=$(pgrep -f "workload.num_requests=10000000" | while read p; do if grep -q python /proc/$p/comm 2>/dev/null && ! grep -q scale_1e6 /proc/$p/cmdline; then echo $p; fi; done | head -1)
  if [ -n "$pid" ]; then
    rss=$(awk '/VmRSS/{print int($2/1024)}' /proc/$pid/status); hwm=$(awk '/VmHWM/{print int($2/1024)}' /proc/$pid/status)
    cpu=$(ps -o cputime= -p $pid)
    d=$(tr '\0' ' ' < /proc/$pid/cmdline | grep -o 'hydra.run.dir=[^ ]*' | cut -d= -f2)
    rq=$(find "$d" -path '*request*' -name '*.parquet' 2>/dev/null | wc -l); tr=$(find "$d" -path '*trace*' -name '*.parquet' 2>/dev/null | wc -l)
    echo "$(date -u +%H:%M:%S) rss=$rss hwm=$hwm cpu=$cpu reqparts=$rq traceparts=$tr load=$(cut -d' ' -f1-3 /proc/loadavg)"
  fi
  sleep 60
done
