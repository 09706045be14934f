#!/usr/bin/env bash
# Instructions per gateway request in the whole demo mesh (gateway, node proxies and
# applications in one process), counted by callgrind: a figure that does not move with the
# load on a shared machine, for comparing two builds before they are timed with ab.sh.
#
#   bash benches/gateway/instructions.sh /path/to/mesh-demo [REQUESTS]
#
# The counters are zeroed after a warm-up, REQUESTS (default 3000) keep-alive requests are
# sent one at a time, and the counts are dumped. Prints the instructions per request and the
# functions that spent the most (self cost), or, with TOP=0, every function. With
# TRACEPARENT=1 the client sends a traceparent, as a traced client does. Needs valgrind.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$(realpath "$1") requests=${2:-3000} top=${TOP:-25}
http_port=${HTTP_PORT:-18180} https_port=${HTTPS_PORT:-18543}
command -v valgrind >/dev/null || { echo "no valgrind: apt-get install -y valgrind" >&2; exit 2; }
work=$(mktemp -d)
echo "callgrind output in $work" >&2
valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
  "$bin" --serve --requests 2 --http-port "$http_port" --https-port "$https_port" >"$work/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1500); do grep -q '^serving' "$work/log" && break; sleep 0.2; done
grep -q '^serving' "$work/log" || { cat "$work/log" >&2; exit 1; }
send() {
  python3 - "$1" "$http_port" <<'PY'
import http.client, os, sys
headers = {"Host": os.environ.get("ROUTE_HOST", "shop.example.com")}
if os.environ.get("TRACEPARENT"):
    headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[2]))
for _ in range(int(sys.argv[1])):
    conn.request("GET", os.environ.get("ROUTE_PATH", "/api/v1/items"), headers=headers)
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        sys.exit(f"answer {resp.status}")
PY
}
send 200
callgrind_control -z "$pid" >/dev/null 2>&1
send "$requests"
callgrind_control -d "$pid" >/dev/null 2>&1
python3 "$here/instructions.py" "$bin" "$work"/cg.*.1 "$requests" "$top"
