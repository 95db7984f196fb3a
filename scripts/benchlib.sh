# benchlib.sh: helpers the bench-*.sh scripts source (". scripts/benchlib.sh").

# distinct8 FILE N SEED writes N distinct 8-puzzle requests, one JSON line
# each, in an order fixed by SEED.
distinct8() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, random, sys
random.seed(int(sys.argv[3]))
seen, out, n = set(), [], int(sys.argv[2])
while len(out) < n:
    b = list(range(9)); random.shuffle(b)
    if tuple(b) in seen:
        continue
    seen.add(tuple(b))
    out.append(json.dumps({"kind": "sliding", "puzzle": {"board": [b[0:3], b[3:6], b[6:9]]}}, separators=(",", ":")))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
}

# ticks PID: the process's user + system CPU so far, in 10 ms ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# freeport asks the kernel for a free port: random ones in a fixed range
# clashed once with a port in use, and a process that failed to start
# then showed only as a missing /proc entry.
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
