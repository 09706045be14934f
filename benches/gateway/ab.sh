#!/usr/bin/env bash
# meshkit's gateway against another build of itself, in one run: the demo mesh of each build
# is started in turn (they bind the same loopback addresses), and wrk measures each in
# alternation, REPEATS times, so that drift on a shared machine falls on both alike. Prints
# the median requests/s of each and their ratio.
#
#   BASELINE=/path/to/older/mesh-demo bash benches/gateway/ab.sh
#
# SUBJECT defaults to this checkout's release mesh-demo (built first). Build the baseline from
# another commit the same way (`cargo build --release -p meshkit-demo --bin mesh-demo` in a
# worktree) and copy the binary aside.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
duration=${DURATION:-5s} threads=${THREADS:-1} connections=${CONNECTIONS:-16}
repeats=${REPEATS:-5} http_port=${HTTP_PORT:-18180} https_port=${HTTPS_PORT:-18543}
host=${ROUTE_HOST:-shop.example.com} path=${ROUTE_PATH:-/api/v1/items}

command -v wrk >/dev/null || { echo "no wrk: apt-get install -y wrk" >&2; exit 2; }
[[ -n ${BASELINE:-} && -x $BASELINE ]] || { echo "set BASELINE to a mesh-demo binary" >&2; exit 2; }
if [[ -z ${SUBJECT:-} ]]; then
  (cd "$root" && cargo build --release -p meshkit-demo --bin mesh-demo)
  SUBJECT=$root/target/release/mesh-demo
fi
work=$(mktemp -d)
echo "logs and wrk output in $work" >&2
pid=
stop() { [[ -n $pid ]] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; }; }
trap stop EXIT

measure() { # name binary round
  local name=$1 bin=$2 round=$3
  "$bin" --serve --requests 2 --http-port "$http_port" --https-port "$https_port" \
    >"$work/$name-$round.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do grep -q '^serving' "$work/$name-$round.log" && break; sleep 0.1; done
  grep -q '^serving' "$work/$name-$round.log" || { cat "$work/$name-$round.log" >&2; exit 1; }
  wrk -t1 -c4 -d1s -H "Host: $host" "http://127.0.0.1:$http_port$path" >/dev/null
  wrk -t"$threads" -c"$connections" -d"$duration" -H "Host: $host" \
    "http://127.0.0.1:$http_port$path" >"$work/$name-$round.txt"
  stop
  sleep 1
}
for round in $(seq "$repeats"); do
  # Alternate which goes first, so neither always meets the warmer machine.
  if (( round % 2 )); then
    measure subject "$SUBJECT" "$round"; measure baseline "$BASELINE" "$round"
  else
    measure baseline "$BASELINE" "$round"; measure subject "$SUBJECT" "$round"
  fi
done

python3 - "$work" "$repeats" <<'PY'
import re, statistics, sys
work, repeats = sys.argv[1], int(sys.argv[2])
def rps(name, r):
    text = open(f"{work}/{name}-{r}.txt").read()
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if bad:
        sys.exit(f"{name} round {r}: {bad.group(0)}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
rows = {n: [rps(n, r) for r in range(1, repeats + 1)] for n in ("subject", "baseline")}
for n, v in rows.items():
    print(f"{n:8}: " + ", ".join(f"{x:,.0f}" for x in v) + f"  (median {statistics.median(v):,.0f} req/s)")
s, b = statistics.median(rows["subject"]), statistics.median(rows["baseline"])
print(f"subject / baseline: {s / b:.3f} ({(s / b - 1) * 100:+.1f}%)")
PY
