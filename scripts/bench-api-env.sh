#!/bin/bash
# bench-api-env.sh ROUNDS SPEC... : the API's CPU per cache hit and its
# peak RSS under one build and setting against another, e.g.
#   scripts/bench-api-env.sh 3 DIR DIR:GC_HEAP_FLOOR=0 DIR:GC_HEAP_FLOOR=64Mi
# Each SPEC is BINDIR[:VAR=VALUE], BINDIR holding `api`, `worker` and
# `loadgen` (go build -o BINDIR/NAME ./cmd/NAME). One redis-server and one
# cmd/worker (from the first SPEC) serve every run; each run starts a
# fresh cmd/api with its SPEC's setting, runs `loadgen -scenario cache
# -clients 16` against it, and prints hits/s, the API's CPU per hit
# (/proc, 10 ms ticks), loadgen's CPU per hit and the API's peak RSS
# (VmHWM). Every round runs every SPEC in turn, so they alternate within
# the same minutes on a shared machine.
set -euo pipefail
rounds=$1; shift
first=${1%%:*}
dir=$(mktemp -d)
pids=()
apid=
cleanup() { for p in "${pids[@]}" $apid; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
waitready() { for _ in $(seq 150); do curl -sf "$1/readyz" >/dev/null && return 0; sleep 0.2; done; echo "not ready: $1" >&2; return 1; }
rp=$(freeport) wp=$(freeport)
redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --logfile "$dir/redis.log" &
pids+=($!)
sleep 0.3
REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$wp PDB_PRELOAD=false "$first/worker" >"$dir/worker.log" 2>&1 &
pids+=($!)
waitready "http://127.0.0.1:$wp"
for round in $(seq "$rounds"); do
  for spec in "$@"; do
    bin=${spec%%:*} setting=
    [ "$spec" != "$bin" ] && setting=${spec#*:}
    ap=$(freeport)
    env ${setting:+"$setting"} REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$ap "$bin/api" >"$dir/api.log" 2>&1 &
    apid=$!
    waitready "http://127.0.0.1:$ap"
    k0=$(ticks $apid)
    out=$("$first/loadgen" -server "http://127.0.0.1:$ap" -scenario cache -clients 16 -duration 10s -json)
    read -r hz n cl <<<"$(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print(r["complete_per_sec"], r["completed"], r["per_task"]["process_cpu_ms"])')"
    k1=$(ticks $apid)
    rss=$(awk '/VmHWM/{print $2}' "/proc/$apid/status")
    printf 'round %d  %-40s %7.0f hits/s  api %5.1f us CPU/hit  client %5.1f us/hit  api peak RSS %d MiB\n' "$round" "$spec" "$hz" \
      "$(echo "($k1 - $k0) * 10000 / $n" | bc -l)" "$(echo "$cl * 1000" | bc -l)" $((rss / 1024))
    kill $apid; wait $apid 2>/dev/null || true; apid=
  done
done
