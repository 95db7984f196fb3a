#!/bin/bash
# bench-million.sh BINDIR: a 1,000,000-item NDJSON batch end to end
# and the fairness case beside it. BINDIR holds `api` and `worker`
# (go build -o BINDIR/NAME ./cmd/NAME). It starts redis-server, the API
# (two API keys) and one worker (defaults) on loopback, then:
#   1. alice POSTs 1,000,000 distinct-ish random 8-puzzles as one
#      application/x-ndjson body: time to the 202;
#   2. two seconds later bob POSTs 100 items: the time until bob's batch
#      is done, and how far alice's batch had got by then;
#   3. alice's batch to done: time, and items per second;
# and prints the peak RSS (VmHWM) of the API, the worker and redis-server,
# the CPU of each, and Redis commands per item. BENCH_ITEMS overrides the
# size.
set -euo pipefail
# freeport asks the kernel for a free port (random ones can clash).
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
bin=$1
n=${BENCH_ITEMS:-1000000}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
python3 - "$dir/big.ndjson" "$n" "$dir/small.ndjson" <<'PY'
import json, random, sys
random.seed(1000000)
def lines(path, n, tag):
    with open(path, "w") as f:
        for i in range(n):
            b = list(range(9)); random.shuffle(b)
            f.write(json.dumps({"custom_id": f"{tag}-{i}", "kind": "sliding",
                                "puzzle": {"board": [b[0:3], b[3:6], b[6:9]]}}, separators=(",", ":")) + "\n")
lines(sys.argv[1], int(sys.argv[2]), "a")
lines(sys.argv[3], 100, "b")
PY
ls -l "$dir/big.ndjson" | awk '{printf "body: %.1f MiB\n", $5 / 1048576}'
rp=$(freeport) ap=$(freeport) wp=$(freeport)
redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --logfile "$dir/redis.log" & rpid=$!; pids+=($rpid)
sleep 0.3
export REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn API_KEYS=alice:alice-key-0123456789,bob:bob-key-0123456789 RATE_LIMIT_BURST=1000 MAX_PENDING_PER_KEY=2000000
HTTP_ADDR=127.0.0.1:$ap "$bin/api" >"$dir/api.log" 2>&1 & apid=$!; pids+=($apid)
HTTP_ADDR=127.0.0.1:$wp PDB_PRELOAD=false "$bin/worker" >"$dir/worker.log" 2>&1 & wpid=$!; pids+=($wpid)
for _ in $(seq 150); do
  curl -sf http://127.0.0.1:$ap/readyz >/dev/null && curl -sf http://127.0.0.1:$wp/readyz >/dev/null && break
  sleep 0.2
done
redis-cli -p $rp config resetstat >/dev/null
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hwm() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
a0=$(ticks $apid) w0=$(ticks $wpid) r0=$(ticks $rpid)
now() { date +%s.%N; }
post() { # KEY FILE
  curl -sf -H "Authorization: Bearer $1" -H 'Content-Type: application/x-ndjson' --data-binary @"$2" \
    http://127.0.0.1:$ap/v1/batches | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
}
counts() { # KEY ID WAIT
  curl -sf -H "Authorization: Bearer $1" "http://127.0.0.1:$ap/v1/batches/$2?limit=1&wait=$3" |
    python3 -c 'import json, sys; b = json.load(sys.stdin); c = b["counts"]; print(b["done"], c["completed"] + c["failed"] + c["canceled"])'
}
t0=$(now)
big=$(post alice-key-0123456789 "$dir/big.ndjson")
t1=$(now)
echo "1M batch $big: 202 after $(echo "$t1 - $t0" | bc) s"
sleep 2
t2=$(now)
small=$(post bob-key-0123456789 "$dir/small.ndjson")
while :; do read -r done ended < <(counts bob-key-0123456789 "$small" 10s); [ "$done" = True ] && break; done
t3=$(now)
read -r _ bigEnded < <(counts alice-key-0123456789 "$big" 0)
echo "fairness: bob's 100-item batch done $(echo "$t3 - $t2" | bc) s after its POST, while alice's had $bigEnded of $n ended"
while :; do read -r done ended < <(counts alice-key-0123456789 "$big" 30s); [ "$done" = True ] && break; done
t4=$(now)
echo "1M batch done $(echo "$t4 - $t0" | bc) s after its POST ($(echo "$n / ($t4 - $t0)" | bc) items/s)"
cmds=$(redis-cli -p $rp info commandstats | tr -d '\r' | grep '^cmdstat_' | sed 's/.*:calls=\([0-9]*\).*/\1/' | paste -sd+ | bc)
echo "peak RSS MiB: api=$(hwm $apid) worker=$(hwm $wpid) redis=$(hwm $rpid)"
echo "cpu s: api=$(echo "($(ticks $apid) - $a0) / 100" | bc -l | cut -c1-6) worker=$(echo "($(ticks $wpid) - $w0) / 100" | bc -l | cut -c1-6) redis=$(echo "($(ticks $rpid) - $r0) / 100" | bc -l | cut -c1-6)"
echo "redis commands per item: $(echo "scale=2; $cmds / ($n + 100)" | bc)"
