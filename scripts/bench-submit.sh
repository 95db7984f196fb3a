#!/bin/bash
# bench-submit.sh ROUNDS BINDIR... : the ratio that matters for bulk work
# 100,000 distinct random 8-puzzles solved by
# `puzzlectl solve --local --format json < jobs` against
# `puzzlectl submit -f jobs --wait --out results` on a real stack
# (redis-server, cmd/api, one cmd/worker, all defaults), in the same run.
#
# Each BINDIR holds `api`, `worker` and `puzzlectl` built from one tree
# (go build -o BINDIR/NAME ./cmd/NAME). Every round runs every BINDIR in
# turn, so builds alternate within the same minutes on this shared
# machine, and each run measures local first, then the service:
#   wall seconds of each, their ratio (local/service: 1.0 means the queue
#   costs nothing), CPU per puzzle of every process (from /proc, 10 ms
#   ticks), and Redis commands per puzzle (INFO commandstats, scripts'
#   inner calls included; BENCH_CMDSTATS=DIR keeps each run's commandstats).
#   It also checks that the service wrote the same
#   results as the local solve, line for line.
set -euo pipefail
rounds=$1; shift
n=${BENCH_ITEMS:-100000}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
. "$(dirname "$0")/benchlib.sh"
distinct8 "$dir/jobs.jsonl" "$n" 2026
one() {
  local bin=$1 label=$2
  local rp ap wp
  rp=$(freeport) ap=$(freeport) wp=$(freeport)
  local run="$dir/run"; rm -rf "$run"; mkdir -p "$run"
  # Local first: the floor the service is held to.
  local t0 t1 lwall
  t0=$(date +%s.%N)
  "$bin/puzzlectl" solve --local --format json <"$dir/jobs.jsonl" >"$run/local.out"
  t1=$(date +%s.%N); lwall=$(echo "$t1 - $t0" | bc)
  redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$run" --logfile "$run/redis.log" &
  local rpid=$!; pids+=($rpid)
  sleep 0.3
  REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$ap "$bin/api" >"$run/api.log" 2>&1 &
  local apid=$!; pids+=($apid)
  REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$wp PDB_PRELOAD=false "$bin/worker" >"$run/worker.log" 2>&1 &
  local wpid=$!; pids+=($wpid)
  for _ in $(seq 150); do
    curl -sf http://127.0.0.1:$ap/readyz >/dev/null && curl -sf http://127.0.0.1:$wp/readyz >/dev/null && break
    sleep 0.2
  done
  for p in "redis-server:$rpid:redis.log" "api:$apid:api.log" "worker:$wpid:worker.log"; do
    IFS=: read -r name pid log <<<"$p"
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "bench-submit: $name ($bin) did not start; the end of $log:" >&2
      tail -5 "$run/$log" >&2
      exit 1
    fi
  done
  redis-cli -p $rp config resetstat >/dev/null
  local a0 w0 r0 swall c_user c_sys
  a0=$(ticks $apid) w0=$(ticks $wpid) r0=$(ticks $rpid)
  t0=$(date +%s.%N)
  /usr/bin/time -f '%U %S' -o "$run/cli.time" "$bin/puzzlectl" --server http://127.0.0.1:$ap \
    submit -f "$dir/jobs.jsonl" --wait --out "$run/service.out" --run-id "$label-$RANDOM" 2>"$run/cli.err" || true
  t1=$(date +%s.%N); swall=$(echo "$t1 - $t0" | bc)
  local da dw dr
  da=$(($(ticks $apid) - a0)) dw=$(($(ticks $wpid) - w0)) dr=$(($(ticks $rpid) - r0))
  read -r c_user c_sys <"$run/cli.time"
  local cmds
  cmds=$(redis-cli -p $rp info commandstats | tr -d '\r' | grep '^cmdstat_' | sed 's/.*:calls=\([0-9]*\).*/\1/' | paste -sd+ | bc)
  # Same answers, line for line: the service's lines carry the result
  # under "result" beside line and id.
  local same
  same=$(python3 - "$run/local.out" "$run/service.out" <<'PY'
import json, sys
loc = [l for l in open(sys.argv[1]).read().splitlines() if l]
svc = [json.loads(l) for l in open(sys.argv[2]).read().splitlines() if l]
svc.sort(key=lambda r: r["line"])
bad = sum(1 for a, b in zip(loc, svc) if json.loads(a) != b.get("result"))
print("same" if len(loc) == len(svc) and bad == 0 else f"DIFFERENT({len(loc)} vs {len(svc)}, {bad} differ)")
PY
)
  # BENCH_CMDSTATS=DIR keeps each run's INFO commandstats (calls and usec
  # per command; EVALSHA's usec includes its scripts' inner calls).
  if [ -n "${BENCH_CMDSTATS:-}" ]; then
    mkdir -p "$BENCH_CMDSTATS"
    redis-cli -p $rp info commandstats | tr -d '\r' | grep '^cmdstat_' >"$BENCH_CMDSTATS/${label//[#\/]/_}.txt"
  fi
  kill $apid $wpid $rpid 2>/dev/null || true; wait $apid $wpid $rpid 2>/dev/null || true
  awk -v l="$label" -v n="$n" -v lw="$lwall" -v sw="$swall" -v a="$da" -v w="$dw" -v r="$dr" \
      -v cu="$c_user" -v cs="$c_sys" -v cmds="$cmds" -v same="$same" 'BEGIN {
    printf "%s local=%.2fs service=%.2fs ratio=%.2f  cpu_us_per_item redis=%.1f api=%.1f worker=%.1f cli=%.1f  redis_cmds_per_item=%.2f  %s\n",
      l, lw, sw, lw / sw, r * 1e4 / n, a * 1e4 / n, w * 1e4 / n, (cu + cs) * 1e6 / n, cmds / n, same }'
}
for r in $(seq "$rounds"); do
  for bin in "$@"; do one "$bin" "$(basename "$bin")#$r"; done
done
