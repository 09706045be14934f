#!/usr/bin/env bash
# The HBONE pair as people deploy it, beside Envoy's, with the project's shared peer script:
#   run 1: Envoy HBONE client -> Envoy HBONE server      (plus direct TCP and an Envoy mTLS pair)
#   run 2: hbone-connect      -> hbone-serve, built with ring (the default crypto provider)
#   run 3: hbone-connect      -> hbone-serve, built with `--features aws-lc-rs`
# Every run measures iperf3 throughput and 1 B / 1 KiB ping-pong round trips on 127.0.0.1 and
# includes direct TCP and an Envoy mTLS pair, the common yardsticks between the runs. Beside
# each run, cpu.py reads the user + system time the pair's two proxy processes spend during
# each iperf3 transfer (/proc/PID/stat): the headline figure is CPU seconds per GiB forwarded,
# with the system (kernel) part of it on its own row.
#
#   bash benches/pair/run.sh            (from the repository root; REPEATS, DURATION as in
#                                        the shared script; PROVIDERS="ring" for runs 1-2 only)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
peers=${PEERS_DIR:-$root/../shared/peers/envoy}
[[ -x $peers/run.sh || -f $peers/run.sh ]] || { echo "no shared peer script at $peers" >&2; exit 2; }

export WORK=${WORK:-$(mktemp -d)}
export REPEATS=${REPEATS:-3} DURATION=${DURATION:-10}
threads=${THREADS:-1}
providers=${PROVIDERS:-ring aws-lc-rs}

# One build per provider, each copied aside before the next build replaces it.
for provider in $providers; do
  features=()
  [[ $provider == ring ]] || features=(--features "$provider")
  cargo build --release -p meshkit-tools --bin hbone-connect --bin hbone-serve ${features[@]+"${features[@]}"}
  mkdir -p "$WORK/bin-$provider"
  cp "$root/target/release/hbone-connect" "$root/target/release/hbone-serve" "$WORK/bin-$provider/"
done

# measure NAME CMD...: runs CMD (one run of the shared script, RUN_DIR=$WORK/NAME) with the
# CPU sampler beside it.
measure() {
  local name=$1; shift
  rm -rf "${WORK:?}/$name"; mkdir -p "$WORK/$name"
  python3 "$root/benches/pair/cpu.py" "$WORK/$name" "$WORK/cpu-$name.json" &
  local sampler=$!
  RUN_DIR=$WORK/$name "$@" || { kill "$sampler" 2>/dev/null; return 1; }
  wait "$sampler"
}

echo "== run 1: Envoy pair" >&2
measure envoy bash "$peers/run.sh"

run=2
for provider in $providers; do
  echo "== run $run: meshkit pair ($provider; hbone-connect -> hbone-serve, $threads worker thread(s) each)" >&2
  run=$((run + 1))
  export MESHKIT_BIN=$WORK/bin-$provider MESHKIT_THREADS=$threads
  SKIP_INSTALL=1 ENVOY_SERVER=0 ENVOY_CLIENT=0 \
    HBONE_UPSTREAM=127.0.0.1:15018 \
    PEER_SERVER_CMD='exec "$MESHKIT_BIN/hbone-serve" --threads "$MESHKIT_THREADS" --listen 127.0.0.1:15018 --cert "$CERT_DIR/server.crt" --key "$CERT_DIR/server.key" --ca "$CERT_DIR/ca.crt" --allow-id "spiffe://$TRUST_DOMAIN/ns/default/sa/client"' \
    PEER_CLIENT_CMD='exec "$MESHKIT_BIN/hbone-connect" --threads "$MESHKIT_THREADS" --listen "127.0.0.1:$CLIENT_IPERF_PORT=127.0.0.1:$IPERF_PORT" --listen "127.0.0.1:$CLIENT_ECHO_PORT=127.0.0.1:$ECHO_PORT" --upstream "$HBONE_UPSTREAM" --cert "$CERT_DIR/client.crt" --key "$CERT_DIR/client.key" --ca "$CERT_DIR/ca.crt" --server-id "spiffe://$TRUST_DOMAIN/ns/default/sa/server"' \
    measure "meshkit-$provider" bash "$peers/run.sh"
done

python3 - "$WORK" $providers <<'PY'
import json, statistics, sys
work, providers = sys.argv[1], sys.argv[2:]
load = lambda name: json.load(open(f"{work}/{name}/results.json"))
envoy, ours = load("envoy"), {p: load(f"meshkit-{p}") for p in providers}
cpu_of = lambda name: json.load(open(f"{work}/cpu-{name}.json"))
cpu_envoy, cpu_ours = cpu_of("envoy"), {p: cpu_of(f"meshkit-{p}") for p in providers}
med = statistics.median
def thr(r, k): return med(r["throughput_gbps"][k])
def rtt(r, k): return med(j["median_us"] for j in r["latency"][k])
print("\n| | Envoy pair | " + " | ".join(f"meshkit ({p}) | / Envoy" for p in providers) + " |")
print("|---|---|" + "---|---|" * len(providers))
ce = cpu_envoy["hbone"]["cpu_s_per_gib"]
print(f"| CPU s per GiB (both proxies) | {ce:.3f} | " + " | ".join(
    f"{c['hbone']['cpu_s_per_gib']:.3f} | {c['hbone']['cpu_s_per_gib']/ce:.2f}" for c in cpu_ours.values()) + " |")
# The kernel's part (system time) and the proxies' own (user time), each beside Envoy's.
user = lambda c: c["hbone"]["cpu_s_per_gib"] - c["hbone"]["system_s_per_gib"]
for label, part in (("of which system (kernel)", lambda c: c["hbone"]["system_s_per_gib"]),
                    ("of which user (the proxies' code)", user)):
    pe = part(cpu_envoy)
    print(f"| {label} | {pe:.3f} | " + " | ".join(
        f"{part(c):.3f} | {part(c)/pe:.2f}" for c in cpu_ours.values()) + " |")
te = thr(envoy, "hbone")
print(f"| iperf3 Gbit/s | {te:.2f} | " + " | ".join(
    f"{thr(r, 'hbone'):.2f} | {thr(r, 'hbone')/te:.2f}" for r in ours.values()) + " |")
for size in ("1", "1024"):
    k = f"hbone-{size}"
    if k in envoy["latency"] and all(k in r["latency"] for r in ours.values()):
        re = rtt(envoy, k)
        print(f"| RTT median {size} B (us) | {re:.0f} | " + " | ".join(
            f"{rtt(r, k):.0f} | {rtt(r, k)/re:.2f}" for r in ours.values()) + " |")
runs = [("Envoy run", envoy, cpu_envoy)] + [(f"meshkit ({p}) run", ours[p], cpu_ours[p]) for p in providers]
for name, r, c in runs:
    print(f"\n{name}: direct {thr(r, 'direct'):.2f} Gbit/s, Envoy mTLS pair {thr(r, 'tls'):.2f} Gbit/s, "
          f"HBONE {thr(r, 'hbone'):.2f} Gbit/s (HBONE / mTLS {thr(r, 'hbone')/thr(r, 'tls'):.2f}); "
          f"CPU s per GiB: Envoy mTLS pair {c['tls']['cpu_s_per_gib']:.3f}, "
          f"HBONE {c['hbone']['cpu_s_per_gib']:.3f} "
          f"(HBONE / mTLS {c['hbone']['cpu_s_per_gib']/c['tls']['cpu_s_per_gib']:.2f})")
PY
