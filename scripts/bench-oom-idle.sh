#!/bin/bash
# bench-oom-idle.sh WORKERBIN: what one idle worker asks of a Redis that
# refuses writes (maxmemory 1, noeviction): the commands Redis took in 5 s,
# the dequeue script's share and Redis's time on it (INFO commandstats),
# and the worker's CPU ticks (10 ms) over the same 5 s.
set -euo pipefail
w=$1
. "$(dirname "$0")/benchlib.sh"
dir=$(mktemp -d)
rp=$(freeport) hp=$(freeport)
redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --logfile "$dir/redis.log" &
rpid=$!
trap 'kill $wpid $rpid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$rp" ping >/dev/null 2>&1 && break; sleep 0.1; done
REDIS_URL=redis://127.0.0.1:$rp HTTP_ADDR=127.0.0.1:$hp "$w" >"$dir/worker.log" 2>&1 &
wpid=$!
sleep 10 # past the start-up's table build
redis-cli -p "$rp" config set maxmemory-policy noeviction >/dev/null
redis-cli -p "$rp" config set maxmemory 1 >/dev/null
sleep 1
redis-cli -p "$rp" config resetstat >/dev/null
t0=$(ticks $wpid)
sleep 5
t1=$(ticks $wpid)
echo "in 5 s: $(redis-cli -p "$rp" info stats | grep -o 'total_commands_processed:[0-9]*'), worker CPU ticks $((t1 - t0))"
redis-cli -p "$rp" info commandstats | grep '^cmdstat_evalsha'
