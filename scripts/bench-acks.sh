#!/bin/bash
# bench-acks.sh ROUNDS BINDIR : what REDIS_ACK_REPLICAS=1 costs, against
# REDIS_ACK_REPLICAS=0 on the same build, alternated within one run on a
# master with one replica (redis-server twice, no persistence) and one
# cmd/api and one cmd/worker (defaults otherwise).
#
# BINDIR holds `api`, `worker`, `puzzlectl` and `loadgen` (go build -o
# BINDIR/NAME ./cmd/NAME). Every round runs acks=0 then acks=1, each on
# fresh processes, and prints per run:
#   singles: loadgen's throughput scenario (distinct 8-puzzles, POST
#     ?wait=, BENCH_CLIENTS clients for BENCH_DURATION): tasks/s, CPU per
#     task of the api, the worker, the master and the replica (/proc, 10 ms
#     ticks), the master's commands per task (INFO commandstats, scripts'
#     inner calls included);
#   batch: BENCH_ITEMS distinct 8-puzzles through
#     `puzzlectl submit -f jobs --wait --out results`: wall seconds, the
#     same CPU figures per item, commands per item.
# BENCH_CMDSTATS=DIR keeps the master's INFO commandstats of each part.
set -euo pipefail
rounds=$1 bin=$2
n=${BENCH_ITEMS:-100000}
clients=${BENCH_CLIENTS:-16}
dur=${BENCH_DURATION:-10s}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
. "$(dirname "$0")/benchlib.sh"
distinct8 "$dir/jobs.jsonl" "$n" 2027
cmds() { redis-cli -p "$1" info commandstats | awk -F'[=,:]' '/^cmdstat_/ && $1 != "cmdstat_info" {s += $3} END {print s}'; }
waitready() { for _ in $(seq 150); do curl -sf "$1/readyz" >/dev/null && return 0; sleep 0.2; done; echo "not ready: $1" >&2; return 1; }
# report LABEL N: CPU per unit of every process since the marks, and the
# master's commands per unit.
report() {
  local label=$1 k=$2
  printf '%-16s us CPU per item: api %6.1f, worker %6.1f, master %5.1f, replica %5.1f; %5.2f cmds/item\n' "$label" \
    "$(echo "($(ticks $apid) - $a0) * 10000 / $k" | bc -l)" "$(echo "($(ticks $wpid) - $w0) * 10000 / $k" | bc -l)" \
    "$(echo "($(ticks $rpid) - $r0) * 10000 / $k" | bc -l)" "$(echo "($(ticks $spid) - $s0) * 10000 / $k" | bc -l)" \
    "$(echo "($(cmds $rp) - $c0) / $k" | bc -l)"
}
mark() { a0=$(ticks $apid) w0=$(ticks $wpid) r0=$(ticks $rpid) s0=$(ticks $spid) c0=$(cmds $rp); }
for round in $(seq "$rounds"); do
  for acks in 0 1; do
    rp=$(freeport) sp=$(freeport) ap=$(freeport) wp=$(freeport)
    run="$dir/run"; rm -rf "$run"; mkdir -p "$run/m" "$run/s"
    redis-server --port $rp --bind 127.0.0.1 --save '' --appendonly no --dir "$run/m" --logfile "$run/m/redis.log" &
    rpid=$!; pids+=($rpid)
    redis-server --port $sp --bind 127.0.0.1 --save '' --appendonly no --dir "$run/s" --logfile "$run/s/redis.log" \
      --replicaof 127.0.0.1 $rp &
    spid=$!; pids+=($spid)
    sleep 0.3
    for _ in $(seq 100); do redis-cli -p $sp info replication | grep -q master_link_status:up && break; sleep 0.1; done
    export REDIS_URL=redis://127.0.0.1:$rp/0 LOG_LEVEL=warn REDIS_ACK_REPLICAS=$acks
    HTTP_ADDR=127.0.0.1:$ap "$bin/api" >"$run/api.log" 2>&1 &
    apid=$!; pids+=($apid)
    HTTP_ADDR=127.0.0.1:$wp PDB_PRELOAD=false "$bin/worker" >"$run/worker.log" 2>&1 &
    wpid=$!; pids+=($wpid)
    waitready http://127.0.0.1:$ap; waitready http://127.0.0.1:$wp
    echo "round $round acks=$acks, load $(cut -d' ' -f1 /proc/loadavg)"
    mark
    out=$("$bin/loadgen" -server http://127.0.0.1:$ap -scenario throughput -submit-wait -clients "$clients" -duration "$dur" -json)
    read -r hz k errs <<<"$(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print(r["complete_per_sec"], r["completed"], r["errors"])')"
    printf 'acks=%s singles %7.0f tasks/s, %s errors\n' "$acks" "$hz" "$errs"
    report "acks=$acks singles" "$k"
    # BENCH_CMDSTATS=DIR keeps the master's commandstats after each part.
    [ -n "${BENCH_CMDSTATS:-}" ] && mkdir -p "$BENCH_CMDSTATS" &&
      redis-cli -p $rp info commandstats | tr -d '\r' | grep '^cmdstat_' >"$BENCH_CMDSTATS/singles-acks$acks-$round.txt"
    mark
    t0=$(date +%s.%N)
    "$bin/puzzlectl" --server http://127.0.0.1:$ap submit -f "$dir/jobs.jsonl" --wait --out "$run/service.out" \
      --run-id "acks$acks-$round-$RANDOM" 2>"$run/cli.err" || { echo "puzzlectl failed:"; tail -3 "$run/cli.err"; }
    t1=$(date +%s.%N)
    printf 'acks=%s batch   %d items in %.1f s, %d result lines\n' "$acks" "$n" "$(echo "$t1 - $t0" | bc)" "$(wc -l <"$run/service.out")"
    report "acks=$acks batch" "$n"
    [ -n "${BENCH_CMDSTATS:-}" ] &&
      redis-cli -p $rp info commandstats | tr -d '\r' | grep '^cmdstat_' >"$BENCH_CMDSTATS/batch-acks$acks-$round.txt"
    grep -c "not confirmed" "$run/worker.log" | sed "s/^/acks=$acks unconfirmed deliveries (worker log): /" || true
    kill $wpid $apid $spid $rpid 2>/dev/null || true
    wait $wpid $apid $spid $rpid 2>/dev/null || true
    unset REDIS_ACK_REPLICAS
  done
done
