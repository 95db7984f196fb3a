#!/bin/bash
# bench-singles.sh ROUNDS BINDIR... : cache hits of single tasks against a
# separate API process, beside the floor: a bare net/http
# server making one Lua round trip per request (loadgen -serve-floor,
# cmd/loadgen/floor.go), on the same Redis, in the same minutes.
#
# Each BINDIR holds `api` and `worker` built from one tree (go build -o
# BINDIR/NAME ./cmd/NAME); the last one also `loadgen`, which is the
# client of every run and serves the floor. Every round runs every BINDIR in
# turn, so builds alternate within the same minutes on this shared
# machine. Each run starts redis-server, cmd/api and one cmd/worker (all
# defaults, auth off unless BENCH_API_KEYS is set, e.g. bench:k), then
# runs `loadgen -server URL -scenario cache -clients 16` against the API
# and against the floor, and prints per run: hits/s of each, their ratio,
# the server process's CPU per request (/proc, 10 ms ticks) and Redis
# commands per request (INFO commandstats, scripts' inner calls included).
# Then it runs the throughput scenario of distinct 8-puzzles against the
# API (POST ?wait=, 16 clients) and prints its latency percentiles and
# the CPU per task of each process: api, worker, redis-server and
# loadgen's clients; then the Redis commands per second with no work.
# A BINDIR may hold a file `env` of VAR=value lines, set for its api and
# worker: one build run with two settings is two BINDIRs of the same
# binaries (e.g. tracing off, and on with OTEL_EXPORTER_OTLP_ENDPOINT).
set -euo pipefail
rounds=$1; shift
clients=${BENCH_CLIENTS:-16}
dur=${BENCH_DURATION:-10s} # the cache scenario runs for half of it
dir=$(mktemp -d)
lg="${!#}/loadgen"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
cmds() { redis-cli -p "$1" info commandstats | awk -F'[=,:]' '/^cmdstat_/ && $1 != "cmdstat_info" {s += $3} END {print s}'; }
waitready() { for _ in $(seq 150); do curl -sf "$1/readyz" >/dev/null && return 0; sleep 0.2; done; echo "not ready: $1" >&2; return 1; }
# measure LABEL PID PORT URL: one cache scenario against URL served by PID,
# with the CPU per request of the server, of Redis (RPID) and of
# loadgen's clients: the machine is saturated, so the ratio of the rates
# is that of the three processes' CPU per request summed.
measure() {
  local label=$1 pid=$2 rp=$3 url=$4
  local c0 k0 r0 out rate n
  c0=$(cmds "$rp") k0=$(ticks "$pid") r0=$(ticks "$rpid")
  out=$("$lg" -server "$url" -scenario cache -clients "$clients" -duration "$dur" -json)
  rate=$(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print(r["complete_per_sec"], r["completed"], r["errors"], r["per_task"]["process_cpu_ms"])')
  read -r hz n errs cl <<<"$rate"
  local dk dc dr
  dk=$(( $(ticks "$pid") - k0 )) dc=$(( $(cmds "$rp") - c0 )) dr=$(( $(ticks "$rpid") - r0 ))
  printf '%-8s %-6s %9.0f hits/s  us CPU/req: server %6.1f, redis %5.1f, client %5.1f  %5.1f cmds/req  errors %s\n' "$name" "$label" "$hz" \
    "$(echo "$dk * 10000 / $n" | bc -l)" "$(echo "$dr * 10000 / $n" | bc -l)" "$(echo "$cl * 1000" | bc -l)" "$(echo "$dc / $n" | bc -l)" "$errs"
  eval "rate_$label=$hz"
}
for round in $(seq "$rounds"); do
  for bin in "$@"; do
    name=$(basename "$bin")
    rp=$(freeport) ap=$(freeport) wp=$(freeport) fp=$(freeport)
    run="$dir/run"; rm -rf "$run"; mkdir -p "$run"
    redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$run" --logfile "$run/redis.log" &
    rpid=$!; pids+=($rpid)
    sleep 0.3
    envs=()
    if [ -f "$bin/env" ]; then mapfile -t envs <"$bin/env"; fi
    env "${envs[@]}" API_KEYS=${BENCH_API_KEYS:-} REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$ap "$bin/api" >"$run/api.log" 2>&1 &
    apid=$!; pids+=($apid)
    env "${envs[@]}" REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$wp PDB_PRELOAD=false "$bin/worker" >"$run/worker.log" 2>&1 &
    wpid=$!; pids+=($wpid)
    "$lg" -serve-floor 127.0.0.1:$fp -floor-redis 127.0.0.1:$rp 2>"$run/floor.log" &
    fpid=$!; pids+=($fpid)
    waitready http://127.0.0.1:$ap; waitready http://127.0.0.1:$wp; waitready http://127.0.0.1:$fp
    echo "round $round $name, load $(cut -d' ' -f1 /proc/loadavg)"
    measure api $apid $rp http://127.0.0.1:$ap
    measure floor $fpid $rp http://127.0.0.1:$fp
    printf '%-8s ratio  %.2f\n' "$name" "$(echo "$rate_api / $rate_floor" | bc -l)"
    a0=$(ticks $apid) w0=$(ticks $wpid) r0=$(ticks $rpid) c0=$(cmds "$rp")
    out=$("$lg" -server http://127.0.0.1:$ap -scenario throughput -submit-wait -clients "$clients" -duration "$dur" -json)
    read -r hz n cl p50 p99 <<<"$(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; l=r["latency_ms"]; print(r["complete_per_sec"], r["completed"], r["per_task"]["process_cpu_ms"], l["p50"], l["p99"])')"
    printf '%-8s singles %7.0f tasks/s  p50 %.1f ms, p99 %.1f ms  us CPU per task: api %.0f, worker %.0f, redis %.0f, client %.0f; %.1f cmds/task\n' "$name" "$hz" "$p50" "$p99" \
      "$(echo "($(ticks $apid) - $a0) * 10000 / $n" | bc -l)" "$(echo "($(ticks $wpid) - $w0) * 10000 / $n" | bc -l)" \
      "$(echo "($(ticks $rpid) - $r0) * 10000 / $n" | bc -l)" "$(echo "$cl * 1000" | bc -l)" "$(echo "($(cmds "$rp") - $c0) / $n" | bc -l)"
    # Idle: what the API and the worker send Redis with no work, per second.
    c0=$(cmds "$rp"); sleep "${BENCH_IDLE:-3}"
    printf '%-8s idle    %.0f Redis commands/s\n' "$name" "$(echo "($(cmds "$rp") - $c0) / ${BENCH_IDLE:-3}" | bc -l)"
    kill $fpid $wpid $apid $rpid 2>/dev/null || true
    wait $fpid $wpid $apid $rpid 2>/dev/null || true
  done
done
