#!/usr/bin/env bash
# meshkit's control plane beside istiod on one API server, in one run: resident memory after
# sync, CPU to the first full push, and the time from a Pod turning Ready to every
# ztunnel-like client holding it (p50, p99), with bytes and CPU per change. What is measured
# and how: benches/examples/control_planes.rs.
#
#   bash benches/control-plane/run.sh       (from anywhere; SERVICES=1000 PODS_PER_SERVICE=2
#                                            NAMESPACES=10 CLIENTS=20 CHANGES=100 by default)
#
# Needs Go (the API server, etcd and istiod are built from their modules by
# test-support/kube/build.sh, cached in target/kube).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
bash test-support/kube/build.sh >&2
cargo build --release -p meshkit-control-plane --bin control-plane >&2
cargo run --release -p meshkit-benches --example control_planes
