#!/usr/bin/env bash
# The HBONE pair as people deploy it, beside Envoy's, with the project's shared peer script:
#   run 1: Envoy HBONE client -> Envoy HBONE server      (plus direct TCP and an Envoy mTLS pair)
#   run 2: hbone-connect      -> hbone-serve             (plus direct TCP and an Envoy mTLS pair)
# Both runs measure iperf3 throughput and 1 B / 1 KiB ping-pong round trips on 127.0.0.1; the
# direct and Envoy-mTLS cases in each run are the common yardsticks between the two runs.
#
#   bash benches/pair/run.sh            (from the repository root; REPEATS, DURATION as in
#                                        the shared script)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
peers=${PEERS_DIR:-$root/../shared/peers/envoy}
[[ -x $peers/run.sh || -f $peers/run.sh ]] || { echo "no shared peer script at $peers" >&2; exit 2; }

cargo build --release -p meshkit-examples --bin hbone-connect --bin hbone-serve
bin=$root/target/release
export WORK=${WORK:-$(mktemp -d)}
export REPEATS=${REPEATS:-3} DURATION=${DURATION:-10}
threads=${THREADS:-1}

echo "== run 1: Envoy pair" >&2
RUN_DIR=$WORK/envoy bash "$peers/run.sh"

echo "== run 2: meshkit pair (hbone-connect -> hbone-serve, $threads worker thread(s) each)" >&2
export MESHKIT_BIN=$bin MESHKIT_THREADS=$threads
RUN_DIR=$WORK/meshkit SKIP_INSTALL=1 ENVOY_SERVER=0 ENVOY_CLIENT=0 \
  HBONE_UPSTREAM=127.0.0.1:15018 \
  PEER_SERVER_CMD='exec "$MESHKIT_BIN/hbone-serve" --threads "$MESHKIT_THREADS" --listen 127.0.0.1:15018 --cert "$CERT_DIR/server.crt" --key "$CERT_DIR/server.key" --ca "$CERT_DIR/ca.crt" --allow-id "spiffe://$TRUST_DOMAIN/ns/default/sa/client"' \
  PEER_CLIENT_CMD='exec "$MESHKIT_BIN/hbone-connect" --threads "$MESHKIT_THREADS" --listen "127.0.0.1:$CLIENT_IPERF_PORT=127.0.0.1:$IPERF_PORT" --listen "127.0.0.1:$CLIENT_ECHO_PORT=127.0.0.1:$ECHO_PORT" --upstream "$HBONE_UPSTREAM" --cert "$CERT_DIR/client.crt" --key "$CERT_DIR/client.key" --ca "$CERT_DIR/ca.crt" --server-id "spiffe://$TRUST_DOMAIN/ns/default/sa/server"' \
  bash "$peers/run.sh"

python3 - "$WORK/envoy/results.json" "$WORK/meshkit/results.json" <<'PY'
import json, statistics, sys
envoy, ours = (json.load(open(p)) for p in sys.argv[1:3])
med = statistics.median
def thr(r, k): return med(r["throughput_gbps"][k])
def rtt(r, k): return med(j["median_us"] for j in r["latency"][k])
print("\n| | Envoy pair | meshkit pair | meshkit / Envoy |")
print("|---|---|---|---|")
te, tm = thr(envoy, "hbone"), thr(ours, "hbone")
print(f"| iperf3 Gbit/s | {te:.2f} | {tm:.2f} | {tm/te:.2f} |")
for size in ("1", "1024"):
    k = f"hbone-{size}"
    if k in envoy["latency"] and k in ours["latency"]:
        re, rm = rtt(envoy, k), rtt(ours, k)
        print(f"| RTT median {size} B (us) | {re:.0f} | {rm:.0f} | {rm/re:.2f} |")
for name, r in (("Envoy run", envoy), ("meshkit run", ours)):
    print(f"\n{name}: direct {thr(r, 'direct'):.2f} Gbit/s, Envoy mTLS pair {thr(r, 'tls'):.2f} Gbit/s, "
          f"HBONE {thr(r, 'hbone'):.2f} Gbit/s (HBONE / mTLS {thr(r, 'hbone')/thr(r, 'tls'):.2f})")
PY
