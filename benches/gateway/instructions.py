"""Self cost per function of a callgrind dump, divided by a request count.

valgrind 3.19 reads no symbols from binaries that LLD linked (rustc's default linker), so
callgrind names functions by address; they are named here from the binary's symbol table
(a position-independent executable loads at 0x108000 under valgrind).

    python3 instructions.py BINARY CALLGRIND_FILE REQUESTS [TOP]
"""

import bisect
import collections
import re
import subprocess
import sys

BASE = 0x108000


def symbols(binary):
    out = subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    table = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            table.append((int(parts[0], 16), parts[2]))
    table.sort()
    return [a for a, _ in table], [n for _, n in table]


def self_costs(path, name_of):
    names, costs = {}, collections.Counter()
    current, after_call = None, False
    named = re.compile(r"^(c?fn)=\((\d+)\)(?: (.*))?$")
    for line in open(path):
        m = named.match(line.rstrip("\n"))
        if m:
            if m.group(3) is not None:
                names[m.group(2)] = name_of(m.group(3))
            if m.group(1) == "fn":
                current = names[m.group(2)]
        elif line.startswith("calls="):
            after_call = True  # the next cost line is the call's inclusive cost
        elif line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
            else:
                fields = line.split()
                if len(fields) >= 2:
                    costs[current] += int(fields[1])
    return costs


def main():
    binary, path, requests = sys.argv[1], sys.argv[2], int(sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    addrs, names = symbols(binary)

    def name_of(raw):
        if not raw.startswith("0x"):
            return raw
        i = bisect.bisect_right(addrs, int(raw, 16) - BASE) - 1
        return names[i] if i >= 0 else raw

    costs = self_costs(path, name_of)
    print(f"instructions per request: {sum(costs.values()) / requests:,.0f}")
    for name, cost in costs.most_common(top or None):
        print(f"{cost / requests:10.1f}  {name[:150]}")


if __name__ == "__main__":
    main()
