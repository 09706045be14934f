#!/usr/bin/env bash
# Builds the Kubernetes API server the tests run against, and istiod, from Go modules:
#   etcd             go.etcd.io/etcd/server/v3, through the main package in ./etcd
#   kube-apiserver   k8s.io/kubernetes cmd/kube-apiserver, through the module in ./apiserver
#   pilot-discovery  istio.io/istio pilot/cmd/pilot-discovery (istiod), through the module in
#                    ../istiod, with the build tags of Istio's Makefile (vtprotobuf,disable_pgv)
# and fetches the modules whose CRDs the fixture installs (Gateway API, Istio). It writes into
# MESHKIT_KUBE_DIR (default: target/kube of the workspace), never into the git tree:
#   bin/etcd, bin/kube-apiserver, bin/pilot-discovery   the programs
#   crds                           one CRD file or folder a line, read by the test fixture
#   versions                       what was built, from which module versions
# Idempotent: a program whose build module (go.mod, go.sum, sources) and Go version are those
# of its last build is not built again. Go's own module and build caches make a changed build
# fast after the first.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${MESHKIT_KUBE_DIR:-$(cd "$here/../.." && pwd)/target/kube}
mkdir -p "$out/bin"

# The Go of the machine, whatever a module's toolchain line asks for, and go.sum as committed.
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

KUBE_VERSION=v1.37.2
GATEWAY_API_VERSION=v1.6.3
ISTIO_API_VERSION=v1.32.0

# build NAME MODULE_DIR PACKAGE [LDFLAGS [TAGS]]
build() {
  local name=$1 dir=$2 pkg=$3 ldflags=${4:-} tags=${5:-}
  local stamp
  stamp=$({ go version; echo "$ldflags $tags"; cat "$dir"/go.mod "$dir"/go.sum; cat "$dir"/*.go 2>/dev/null || true; } \
    | sha256sum | cut -d' ' -f1)
  if [[ -x "$out/bin/$name" && -f "$out/bin/$name.stamp" && "$(cat "$out/bin/$name.stamp")" == "$stamp" ]]; then
    echo "$name: up to date"
    return
  fi
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$out/bin/$name.new" "$pkg")
  mv "$out/bin/$name.new" "$out/bin/$name"
  echo "$stamp" >"$out/bin/$name.stamp"
  echo "$name: built in $((SECONDS - start)) s"
}

start=$SECONDS
go version

build etcd "$here/etcd" .
# The version the API server reports (/version) and checks its emulation version against.
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
build kube-apiserver "$here/apiserver" k8s.io/kubernetes/cmd/kube-apiserver \
  "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
   -X k8s.io/component-base/version.gitMajor=1 \
   -X k8s.io/component-base/version.gitMinor=$minor \
   -X k8s.io/component-base/version.gitTreeState=clean"

# istiod, as Istio's Makefile builds it (STANDARD_TAGS), with the version it reports.
istio_version=$(cd "$here/../istiod" && go list -m -f '{{.Version}}' istio.io/istio)
build pilot-discovery "$here/../istiod" istio.io/istio/pilot/cmd/pilot-discovery \
  "-X istio.io/istio/pkg/version.buildVersion=$istio_version" "vtprotobuf,disable_pgv"

# The CRDs are read where the module cache keeps them; nothing of them is copied.
dir_of() {
  (cd "$out" && GOFLAGS= GO111MODULE=on go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
}
gateway_api=$(dir_of "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION")
istio_api=$(dir_of "istio.io/api@$ISTIO_API_VERSION")
{
  echo "$gateway_api/config/crd/standard"
  echo "$istio_api/kubernetes/customresourcedefinitions.gen.yaml"
} >"$out/crds"
while read -r path; do
  [[ -e "$path" ]] || { echo "missing CRD source: $path" >&2; exit 1; }
done <"$out/crds"

{
  echo "etcd: go.etcd.io/etcd/server/v3 $(sed -n 's/^require go.etcd.io\/etcd\/server\/v3 //p' "$here/etcd/go.mod")"
  "$out/bin/etcd" --version | sed 's/^/  /'
  echo "kube-apiserver: k8s.io/kubernetes $KUBE_VERSION"
  "$out/bin/kube-apiserver" --version | sed 's/^/  /'
  echo "pilot-discovery: istio.io/istio $istio_version"
  echo "CRDs: sigs.k8s.io/gateway-api $GATEWAY_API_VERSION (standard channel), istio.io/api $ISTIO_API_VERSION"
} >"$out/versions"
cat "$out/versions"
echo "kube binaries and CRDs in $out ($((SECONDS - start)) s)"
