#!/bin/bash
# batch-commandstats.sh BINDIR LABEL: Redis commands and process CPU of one
# 10,000-item batch through real processes. BINDIR holds `api` and `worker`
# built from the tree to measure (go build -o BINDIR/api ./cmd/api; same for
# ./cmd/worker). It starts redis-server, the API (with one API key, so the
# quota is in play) and one worker on random loopback ports, resets Redis's
# statistics, posts a batch of 10,000 distinct solvable 8-puzzles, long-polls
# it to done, and prints each process's CPU (10 ms ticks) and INFO
# commandstats calls, scripts' inner calls included. Alternate two BINDIRs to
# compare builds within one run (docs/performance.md, "Batches").
set -euo pipefail
# freeport asks the kernel for a free port (random ones can clash).
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
bin=$1 label=${2:-$1}
rp=$(freeport) ap=$(freeport) wp=$(freeport)
dir=$(mktemp -d)
trap 'kill $apid $wpid $rpid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 - "$dir/batch.json" <<'PY'
import json, random, sys
random.seed(7)
seen, out = set(), []
while len(out) < 10000:
    b = list(range(9)); random.shuffle(b)
    tiles = [x for x in b if x]
    if sum(1 for i in range(8) for j in range(i + 1, 8) if tiles[i] > tiles[j]) % 2 or tuple(b) in seen:
        continue
    seen.add(tuple(b)); out.append({"kind": "sliding", "puzzle": {"board": [b[0:3], b[3:6], b[6:9]]}})
json.dump({"tasks": out}, open(sys.argv[1], "w"))
PY
redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --logfile "$dir/redis.log" & rpid=$!
sleep 0.5
export REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn API_KEYS=alice:alice-key-0123456789 RATE_LIMIT_BURST=1000
HTTP_ADDR=127.0.0.1:$ap "$bin/api" >"$dir/api.log" 2>&1 & apid=$!
HTTP_ADDR=127.0.0.1:$wp PDB_PRELOAD=false "$bin/worker" >"$dir/worker.log" 2>&1 & wpid=$!
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:$ap/readyz >/dev/null && curl -sf http://127.0.0.1:$wp/readyz >/dev/null && break
  sleep 0.2
done
sleep 1
redis-cli -p $rp config resetstat >/dev/null
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }
a0=$(cpu $apid) w0=$(cpu $wpid) r0=$(cpu $rpid)
auth="Authorization: Bearer alice-key"
id=$(curl -sf -H "$auth" -H 'Content-Type: application/json' --data-binary @"$dir/batch.json" \
  http://127.0.0.1:$ap/v1/batches | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
for _ in $(seq 20); do
  curl -sf -H "$auth" "http://127.0.0.1:$ap/v1/batches/$id?limit=1&wait=10s" | grep -q '"done":true' && break
done
echo "$label cpu_ticks api=$(($(cpu $apid) - a0)) worker=$(($(cpu $wpid) - w0)) redis=$(($(cpu $rpid) - r0))"
redis-cli -p $rp info commandstats | tr -d '\r' | grep '^cmdstat_' |
  sed 's/^cmdstat_//; s/:calls=\([0-9]*\).*/ \1/' | sort -k2 -n -r |
  awk -v l="$label" '{t += $2; print l, $1, $2} END {printf "%s TOTAL %d (%.3f per item)\n", l, t, t / 10000}'
