#!/bin/bash
# bench-expensive-batch.sh ROUNDS BINDIR... : one key's batch of expensive
# items (the per-key cap covers batch items), end to end through
# `puzzlectl submit -f jobs --wait --out results` on redis-server, cmd/api
# and one cmd/worker (WORKER_CONCURRENCY=2, so the key's cap is 1; auth on
# with one key).
#
# BENCH_SET picks the items: "sweeps" (default; BENCH_ITEMS distinct small
# sweeps that solve in microseconds, so the figure is the queue's and the
# gate's cost per item) or "korf" (the first BENCH_ITEMS of Korf's 100
# 15-puzzles, real searches of tens of milliseconds) or "copies"
# (BENCH_ITEMS copies of Korf's instance 88, a 0.25 s search: identical
# work, which the gate solves once). Each BINDIR holds
# api, worker and puzzlectl of one tree; every round runs each in turn, so
# builds alternate in the same minutes. Prints wall time, items/s, CPU of
# each process per item and Redis commands per item.
set -euo pipefail
# freeport asks the kernel for a free port (random ones can clash).
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rounds=$1; shift
n=${BENCH_ITEMS:-300}
set_=${BENCH_SET:-sweeps}
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
python3 - "$dir/jobs.jsonl" "$n" "$set_" "$here/solvers/sliding/testdata/korf100_goal_1to15_blank_last.tsv" <<'PY'
import json, random, sys
path, n, kind, korf = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
out = []
if kind == "copies":
    line = open(korf).read().splitlines()[88]
    t = [int(x) for x in line.split("\t")[1].split()]
    out = [{"kind": "sliding", "puzzle": {"board": [t[0:4], t[4:8], t[8:12], t[12:16]]}}] * n
elif kind == "korf":
    for line in open(korf).read().splitlines()[1:n + 1]:
        t = [int(x) for x in line.split("\t")[1].split()]
        out.append({"kind": "sliding", "puzzle": {"board": [t[0:4], t[4:8], t[8:12], t[12:16]]}})
else:
    random.seed(2026)
    seen = set()
    while len(out) < n:
        rows = ["".join("*" if random.random() < 0.2 else "." for _ in range(6)) for _ in range(5)]
        if tuple(rows) in seen or all(c == "*" for r in rows for c in r):
            continue
        seen.add(tuple(rows))
        out.append({"kind": "sweep", "puzzle": {"board": rows}})
open(path, "w").write("".join(json.dumps(o, separators=(",", ":")) + "\n" for o in out))
PY
n=$(wc -l <"$dir/jobs.jsonl")
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
one() {
  local bin=$1
  local rp ap wp
  rp=$(freeport) ap=$(freeport) wp=$(freeport)
  local run="$dir/run"; rm -rf "$run"; mkdir -p "$run"
  redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$run" --logfile "$run/redis.log" &
  local rpid=$!; pids+=($rpid)
  sleep 0.3
  REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$ap API_KEYS=bench:bench-secret-key-0123456789 \
    RATE_LIMIT_PER_SECOND=1000 RATE_LIMIT_BURST=1000 "$bin/api" >"$run/api.log" 2>&1 &
  local apid=$!; pids+=($apid)
  REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn HTTP_ADDR=127.0.0.1:$wp WORKER_CONCURRENCY=2 "$bin/worker" >"$run/worker.log" 2>&1 &
  local wpid=$!; pids+=($wpid)
  for _ in $(seq 300); do
    curl -sf http://127.0.0.1:$ap/readyz >/dev/null && curl -sf http://127.0.0.1:$wp/readyz >/dev/null && break
    sleep 0.2
  done
  redis-cli -p $rp config resetstat >/dev/null
  local a0 w0 r0 t0 t1 wall
  a0=$(ticks $apid) w0=$(ticks $wpid) r0=$(ticks $rpid)
  t0=$(date +%s.%N)
  PUZZLEQ_API_KEY=bench-secret-key-0123456789 "$bin/puzzlectl" --server http://127.0.0.1:$ap \
    submit -f "$dir/jobs.jsonl" --wait --out "$run/out.jsonl" --run-id "r$RANDOM" 2>"$run/cli.err" || true
  t1=$(date +%s.%N); wall=$(echo "$t1 - $t0" | bc)
  local da dw dr cmds done_
  da=$(($(ticks $apid) - a0)) dw=$(($(ticks $wpid) - w0)) dr=$(($(ticks $rpid) - r0))
  cmds=$(redis-cli -p $rp info commandstats | tr -d '\r' | grep '^cmdstat_' | sed 's/.*:calls=\([0-9]*\).*/\1/' | paste -sd+ | bc)
  done_=$(grep -c '"completed"' "$run/out.jsonl" || true)
  printf '%-28s %7.2fs %8.1f/s  cpu/item: api %6.0f µs worker %6.0f µs redis %6.0f µs  cmds/item %6.1f  completed %s/%s\n' \
    "$bin" "$wall" "$(echo "$n / $wall" | bc -l)" "$(echo "$da * 10000 / $n" | bc -l)" "$(echo "$dw * 10000 / $n" | bc -l)" \
    "$(echo "$dr * 10000 / $n" | bc -l)" "$(echo "$cmds / $n" | bc -l)" "$done_" "$n"
  kill $apid $wpid $rpid 2>/dev/null || true; wait $apid $wpid $rpid 2>/dev/null || true
}
echo "bench-expensive-batch: $n items ($set_), load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  for b in "$@"; do one "$b"; done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
