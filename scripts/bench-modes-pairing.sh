#!/usr/bin/env bash
# PulseNet's Fig. 11 analogue on real runtimes (docs/benchmarks.md, "Scaling
# modes and the dual track"): regular sandboxes in containerd, the emergency
# track on the native runtime (`brisk up --runtime containerd
# --emergency-runtime native`). Each mode and stable window replays on a
# fresh cluster, because on a small machine a run inherits the teardown of
# the one before it; then `brisk bench modes --merge` compares them.
#
#   sudo scripts/bench-modes-pairing.sh OUT_DIR [TRACE_DIR]
#
# Environment: MODES ("async sync dual"), WINDOWS ("6s 1m 10m"), MINUTES
# (3), TIME_SCALE (0.5), MAX_RUNTIME (20ms), SANDBOX_MEMORY (128 MiB),
# NODE_CPU (100: CPU offered for placement; the trace functions request a
# tenth of a core each). It needs root, containerd, and `make build`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUT_DIR [TRACE_DIR]}
trace=${2:-traces/azure_100}
modes=${MODES:-async sync dual}
windows=${WINDOWS:-6s 1m 10m}
brisk=$PWD/bin/brisk
[ -x "$brisk" ] || { echo "$brisk missing: run make build" >&2; exit 2; }
mkdir -p "$out"

up_pid=""
stop_up() {
  if [ -n "$up_pid" ]; then
    kill -TERM "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
    up_pid=""
  fi
}
trap stop_up EXIT

for w in $windows; do
  for m in $modes; do
    data=$(mktemp -d /tmp/brisk-pairing-XXXXXX)
    "$brisk" image build trace --data-dir "$data" >/dev/null
    "$brisk" up --data-dir "$data" --admin 127.0.0.1:19090 --grpc 127.0.0.1:19091 --invoke 127.0.0.1:18080 \
      --runtime containerd --emergency-runtime native --cpu "${NODE_CPU:-100}" \
      --net-prefix bq --net-bridge bqbr0 --net-subnet 10.216.0.0/16 >"$out/up-$m-$w.log" 2>&1 &
    up_pid=$!
    for _ in $(seq 600); do
      grep -q "worker session up" "$out/up-$m-$w.log" && break
      kill -0 "$up_pid" 2>/dev/null || { cat "$out/up-$m-$w.log" >&2; exit 1; }
      sleep 0.1
    done
    "$brisk" bench modes "$trace" --admin-url 127.0.0.1:19090 --invoke-url 127.0.0.1:18080 \
      --token-file "$data/admin.token" --modes "$m" --stable-windows "$w" --out "$out" \
      --minutes "${MINUTES:-3}" --time-scale "${TIME_SCALE:-0.5}" --max-runtime "${MAX_RUNTIME:-20ms}" \
      --min-sandbox-memory "${SANDBOX_MEMORY:-128}" --skip-minutes 0 --force
    stop_up
    rm -rf "$data"
  done
done
"$brisk" bench modes "$trace" --out "$out" --merge --modes "${modes// /,}" --stable-windows "${windows// /,}"
