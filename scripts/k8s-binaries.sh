#!/usr/bin/env bash
# Builds the Kubernetes pieces brisk is tested and benchmarked against
# (issue 22) from the Go module proxy:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and
# kubelet v1.36.3, etcd v3.6.16, KWOK v0.8.0 and CoreDNS v1.15.0 (only the
# plugins the tests use: the cluster DNS of a real kubelet's Pods). No binary download: each is built
# from source in a throwaway module under the cache directory, which is
# what makes k8s.io/kubernetes buildable as a dependency (its staging
# modules are published as v0.36.3 but required as v0.0.0 with replaces a
# dependent module does not see).
#
#   scripts/k8s-binaries.sh [DIR]     # prints DIR/bin
#
# DIR defaults to $BRISK_K8S_CACHE or /var/cache/brisk/k8s-v1.36.3. A binary
# already in DIR/bin is not built again: a cold build took 4 min 49 s of
# two cores here without the kubelet (7 min user CPU, ~0.5 GB of modules);
# with it, from empty module and build caches, 17 min of CPU (29 min wall on
# a machine loaded by other work; the kubelet alone, after the others, 48 s).
# A warm one does nothing.
set -euo pipefail
k8s=v1.36.3
staging=v0.36.3
etcd=v3.6.16
kwok=v0.8.0
coredns=v1.15.0
dir=${1:-${BRISK_K8S_CACHE:-/var/cache/brisk/k8s-$k8s}}
bin=$dir/bin
mkdir -p "$bin" "$dir/src"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
log() { echo "k8s-binaries: $*" >&2; }

k8s_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
need=0
for b in "${k8s_bins[@]}"; do [ -x "$bin/$b" ] || need=1; done
if [ "$need" = 1 ]; then
  src=$dir/src/kubernetes
  mkdir -p "$src"
  cd "$src"
  if [ ! -f go.mod ]; then
    log "preparing a module for k8s.io/kubernetes $k8s"
    cat > go.mod <<EOF
module brisk.local/k8sbuild

go 1.26.0

require k8s.io/kubernetes $k8s
EOF
    go mod download -json "k8s.io/kubernetes@$k8s" >/dev/null
    upstream=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$k8s.mod
    {
      echo "replace ("
      # The staging modules: the left-hand side of upstream's replace
      # block, each pointed at its published version. sample-cli-plugin is
      # not on the proxy and nothing here needs it.
      awk '/^replace \(/{f=1;next} f&&/^\)/{f=0} f{print $1}' "$upstream" |
        grep '^k8s.io/' | grep -v '^k8s.io/sample-cli-plugin$' |
        while read -r m; do echo "	$m => $m $staging"; done
      echo ")"
    } >> go.mod
  fi
  # tools.go imports every binary's package, so that go mod tidy records
  # their dependencies. A module made before a binary joined the list (the
  # kubelet did later) gets the new import and one more tidy; the binaries
  # already built stay.
  tools=$(
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for b in "${k8s_bins[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
    echo ")"
  )
  if [ "$(cat tools.go 2>/dev/null)" != "$tools" ]; then
    echo "$tools" > tools.go
    go mod tidy
  fi
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=36"
  done
  for b in "${k8s_bins[@]}"; do
    [ -x "$bin/$b" ] && continue
    log "building $b $k8s"
    go build -trimpath -ldflags "$ld" -o "$bin/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$bin/$b.tmp" "$bin/$b"
  done
fi

# new_module NAME REQUIREMENT VERSION: enter $dir/src/NAME, a throwaway
# module requiring one module; returns 1 when it already existed.
new_module() {
  mkdir -p "$dir/src/$1"
  cd "$dir/src/$1"
  [ -f go.mod ] && return 1
  printf 'module brisk.local/%sbuild\n\ngo 1.26.0\n\nrequire %s %s\n' "$1" "$2" "$3" > go.mod
}

if [ ! -x "$bin/etcd" ]; then
  if new_module etcd go.etcd.io/etcd/server/v3 "$etcd"; then
    cat > main.go <<'EOF'
// Command etcd is etcd's own main, built from the module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    go mod tidy
  fi
  log "building etcd $etcd"
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" .
  mv "$bin/etcd.tmp" "$bin/etcd"
fi

if [ ! -x "$bin/kwok" ]; then
  if new_module kwok sigs.k8s.io/kwok "$kwok"; then
    printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kwok/cmd/kwok"\n' > tools.go
    go mod tidy
  fi
  log "building kwok $kwok"
  go build -trimpath -ldflags "-s -w" -o "$bin/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$bin/kwok.tmp" "$bin/kwok"
fi
if [ ! -x "$bin/coredns" ]; then
  if new_module coredns github.com/coredns/coredns "$coredns"; then
    # CoreDNS's own main imports every plugin (clouds' SDKs included):
    # these three keep the build small.
    cat > main.go <<'EOF'
// Command coredns is CoreDNS with the plugins brisk's tests use: cluster
// names from the Kubernetes API on one address, nothing forwarded.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func main() { coremain.Run() }
EOF
    go mod tidy
  fi
  log "building coredns $coredns"
  go build -trimpath -ldflags "-s -w" -o "$bin/coredns.tmp" .
  mv "$bin/coredns.tmp" "$bin/coredns"
fi
echo "$bin"
