"""CPU time the two proxies of a pair spend per GiB they forward, measured beside the shared
peer script while it runs (benches/pair/run.sh starts one of these per run).

    python3 cpu.py RUN_DIR OUT.json

It watches RUN_DIR, the run's folder. When an iperf3 measurement starts (the script creates
`iperf-CASE-R.json`), it reads the user and system time of the case's two proxy processes from
/proc/PID/stat; when the measurement ends (the file gets iperf3's JSON), it reads them again.
The difference is what the two proxies spent forwarding that transfer, which iperf3's JSON
counts in bytes. System time (the kernel's socket, TCP and loopback work done for the
proxies) is kept apart as well: it is the part no proxy's own code can remove. Cases and
their processes, by the PID files the script writes:

    hbone: peer-server + peer-client, or envoy-hbone-server + envoy-hbone-client
    tls:   envoy-tls-server + envoy-tls-client (Envoy's mutual-TLS pair, no HTTP/2)

The iperf3 client and server are not counted. Polling every 5 ms, each bound is found within
5 ms of a transfer of DURATION seconds; clock ticks are 10 ms, over two processes. It stops
when the run's summary.md appears (or after MAX_SECONDS) and writes OUT:

    {"hbone": {"cpu_s": .., "system_s": .., "bytes": .., "cpu_s_per_gib": ..,
               "system_s_per_gib": .., "repeats": [[cpu_s, bytes, system_s], ..]},
     "tls": {..}}
"""

import json
import os
import sys
import time

PROCESSES = {
    "hbone": [("peer-server", "peer-client"), ("envoy-hbone-server", "envoy-hbone-client")],
    "tls": [("envoy-tls-server", "envoy-tls-client")],
}
POLL = 0.005
MAX_SECONDS = 4 * 3600
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system time, and system time alone, of `pid` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name is in parentheses and may hold spaces: fields count from after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    user, system = int(fields[11]), int(fields[12])
    return (user + system) / TICK, system / TICK


def total(pids):
    """User + system time and system time of `pids` together."""
    times = [cpu_seconds(p) for p in pids]
    return sum(t for t, _ in times), sum(s for _, s in times)


def pids(run_dir, case):
    for names in PROCESSES[case]:
        files = [os.path.join(run_dir, f"{n}.pid") for n in names]
        if all(os.path.exists(f) for f in files):
            return [int(open(f).read().strip()) for f in files]
    return None


def main():
    run_dir, out = sys.argv[1], sys.argv[2]
    started = {}  # iperf file -> CPU and system seconds of its case's processes at its start
    done = {}  # case -> [[cpu_s, bytes, system_s], ..]
    finished = set()
    deadline = time.monotonic() + MAX_SECONDS
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(run_dir, "summary.md")):
            break
        try:
            names = os.listdir(run_dir)
        except FileNotFoundError:
            names = []
        for name in names:
            if not (name.startswith("iperf-") and name.endswith(".json")) or name in finished:
                continue
            case = name.split("-")[1]
            if case not in PROCESSES:
                continue
            path = os.path.join(run_dir, name)
            procs = pids(run_dir, case)
            if procs is None:
                continue
            try:
                size = os.path.getsize(path)
                if name not in started:
                    if size == 0:
                        started[name] = total(procs)
                    else:
                        # Already written when first seen: no start to measure from.
                        finished.add(name)
                    continue
                if size == 0:
                    continue
                now = total(procs)
                cpu = now[0] - started[name][0]
                system = now[1] - started[name][1]
                report = json.load(open(path))
            except (OSError, ValueError):
                continue  # a process gone, or the JSON half written: look again
            finished.add(name)
            moved = report["end"]["sum_received"]["bytes"]
            done.setdefault(case, []).append([cpu, moved, system])
        time.sleep(POLL)
    result = {}
    for case, repeats in done.items():
        cpu = sum(c for c, _, _ in repeats)
        system = sum(s for _, _, s in repeats)
        moved = sum(b for _, b, _ in repeats)
        gib = moved / 2**30
        result[case] = {
            "cpu_s": cpu,
            "system_s": system,
            "bytes": moved,
            "cpu_s_per_gib": cpu / gib if moved else None,
            "system_s_per_gib": system / gib if moved else None,
            "repeats": repeats,
        }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
