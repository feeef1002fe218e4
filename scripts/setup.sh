#!/usr/bin/env bash
# Installs what brisk needs on Debian. Idempotent; run as root (or with sudo
# available).
#
#   scripts/setup.sh          what building brisk and running the demo need:
#                             Go, make, curl (seconds when they are there)
#   scripts/setup.sh --test   also what the test suite and code generation
#                             need: a C compiler, containerd and runc, CNI
#                             plugins, protoc, Chromium, the Python Lambda
#                             clients, and the Kubernetes test binaries
#                             (built once per machine, 5-12 minutes)
set -euo pipefail
need_go="1.26"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
TEST=false
case "${1:-}" in
  "") ;;
  --test) TEST=true ;;
  *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

have_go() {
  command -v go >/dev/null 2>&1 || return 1
  local v; v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  [ "$(printf '%s\n%s\n' "$need_go" "$v" | sort -V | head -1)" = "$need_go" ]
}

pkgs=()
command -v make >/dev/null 2>&1 || pkgs+=(make)
command -v curl >/dev/null 2>&1 || pkgs+=(curl)
if $TEST; then
  command -v protoc >/dev/null 2>&1 || pkgs+=(protobuf-compiler)
  command -v git >/dev/null 2>&1 || pkgs+=(git)
  # The native runtime's sandbox init is C (scripts/build-sandbox-init.sh, and
  # cgo in brisk): a compiler and the kernel's and libc's headers.
  command -v gcc >/dev/null 2>&1 || pkgs+=(gcc)
  [ -f /usr/include/x86_64-linux-gnu/sys/mount.h ] || [ -f /usr/include/sys/mount.h ] || pkgs+=(libc6-dev)
  # The containerd runtime (--runtime containerd) and its tests.
  command -v containerd >/dev/null 2>&1 || pkgs+=(containerd)
  command -v runc >/dev/null 2>&1 || pkgs+=(runc)
  # The CNI plugins (bridge, host-local, loopback) of the real kubelet's Pods
  # in the kube runtime's tests (kubecluster.StartKubelet).
  [ -x /usr/lib/cni/bridge ] || pkgs+=(containernetworking-plugins)
  # The headless browser the dashboard's test drives (test/e2e/dashboard_test.go).
  command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
  # The partition lab (test/lab): namespaces and veths (ip), faults (nft),
  # delay (iptables' NFQUEUE target; this kernel has no netem).
  command -v ip >/dev/null 2>&1 || pkgs+=(iproute2)
  command -v nft >/dev/null 2>&1 || pkgs+=(nftables)
  command -v iptables >/dev/null 2>&1 || pkgs+=(iptables)
  # The real Lambda clients (boto3, aws CLI v1) the compatibility tests drive.
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || pkgs+=(python3-venv)
fi
if ! command -v go >/dev/null 2>&1; then pkgs+=(golang-go); fi
if [ ${#pkgs[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
if ! have_go; then
  # An older Go (>= 1.21) fetches the toolchain go.mod asks for from the
  # module proxy by itself.
  export GOTOOLCHAIN=auto
  if ! have_go; then
    echo "setup: brisk needs Go >= $need_go (found: $(go version 2>/dev/null || echo none))" >&2
    exit 1
  fi
fi
if ! $TEST; then
  echo "setup: ok ($(go version)); make build compiles brisk (the Go modules come with it)"
  exit 0
fi
go mod download

# The Kubernetes control plane (etcd, kube-apiserver, KWOK; kubectl, kubelet)
# the kube runtime's tests run against (internal/testutil/kubecluster), built
# from the Go module proxy into a cache that outlives the checkout: about 6
# minutes of two cores the first time on a machine, nothing after. Its
# chatter goes to a log, shown only when the build fails. Without root the
# cache directory is made the user's, so that the build runs as the user.
K8S_CACHE=${BRISK_K8S_CACHE:-/var/cache/brisk/k8s-v1.36.3}
K8S_LOG=${TMPDIR:-/tmp}/brisk-k8s-binaries.log
if [ -n "$SUDO" ] && [ ! -w "$(dirname "$K8S_CACHE")" ]; then
  $SUDO mkdir -p "$K8S_CACHE"
  $SUDO chown -R "$(id -u):$(id -g)" "$K8S_CACHE"
fi
if [ ! -x "$K8S_CACHE/bin/kwok" ] || [ ! -x "$K8S_CACHE/bin/kube-apiserver" ] || [ ! -x "$K8S_CACHE/bin/etcd" ]; then
  echo "setup: building the Kubernetes test binaries into $K8S_CACHE (about 6 minutes; log $K8S_LOG)"
elif [ ! -x "$K8S_CACHE/bin/kubelet" ]; then
  echo "setup: building the kubelet into $K8S_CACHE (about a minute; log $K8S_LOG)"
elif [ ! -x "$K8S_CACHE/bin/coredns" ]; then
  echo "setup: building CoreDNS into $K8S_CACHE (log $K8S_LOG)"
fi
if ! K8S_BIN=$("$(dirname "$0")/k8s-binaries.sh" "$K8S_CACHE" 2>"$K8S_LOG"); then
  echo "setup: building the Kubernetes test binaries failed; last log lines:" >&2
  tail -20 "$K8S_LOG" >&2
  exit 1
fi

# containerd must answer on its socket. Where systemd runs, installing the
# package started it; elsewhere (CI, containers) start it in the background,
# log to a file and record its PID, so that only a containerd this script
# started is ever stopped (.ci/run does, at its end).
CONTAINERD_SOCK=/run/containerd/containerd.sock
CONTAINERD_PIDFILE=/run/brisk-containerd.pid
CONTAINERD_LOG=/var/log/brisk-containerd.log
containerd_answers() { $SUDO ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1; }
if ! containerd_answers; then
  echo "setup: starting containerd (log $CONTAINERD_LOG)"
  $SUDO sh -c "setsid containerd </dev/null >>'$CONTAINERD_LOG' 2>&1 & echo \$! >'$CONTAINERD_PIDFILE'"
  for _ in $(seq 150); do
    containerd_answers && break
    sleep 0.2
  done
  if ! containerd_answers; then
    echo "setup: containerd did not answer on $CONTAINERD_SOCK; last log lines:" >&2
    tail -20 "$CONTAINERD_LOG" >&2 || true
    exit 1
  fi
fi
# boto3 and the aws CLI (v1, the one on PyPI) in a venv of the checkout:
# test/e2e/lambda_test.go calls brisk with them, unmodified.
PYCLIENTS="$(cd "$(dirname "$0")/.." && pwd)/.cache/pyclients"
if ! "$PYCLIENTS/bin/python" -c 'import boto3' >/dev/null 2>&1 || [ ! -x "$PYCLIENTS/bin/aws" ]; then
  echo "setup: installing boto3 and awscli into $PYCLIENTS"
  python3 -m venv "$PYCLIENTS"
  "$PYCLIENTS/bin/pip" install -q --disable-pip-version-check 'boto3>=1.34' 'awscli>=1.32'
fi
echo "setup: ok ($(go version); $(containerd --version | cut -d' ' -f1,3); $("$PYCLIENTS/bin/aws" --version 2>&1 | cut -d' ' -f1); $(chromium --version 2>/dev/null | cut -d' ' -f1,2); Kubernetes test binaries in $K8S_BIN)"
