#!/usr/bin/env bash
# The demo: start a local brisk cluster on embedded defaults, deploy the
# built-in trace function and a plain command, call them, and keep serving
# until Ctrl-C. DEMO_EXIT=1 stops after the calls (used by tests).
set -euo pipefail
cd "$(dirname "$0")/.."
BRISK=${BRISK:-./bin/brisk}
ADMIN=${BRISK_ADMIN:-127.0.0.1:9090}
INVOKE=${BRISK_INVOKE:-127.0.0.1:8080}
export BRISK_ADMIN=$ADMIN BRISK_INVOKE=$INVOKE
DATA=$(mktemp -d /tmp/brisk-demo.XXXXXX)
# The cluster writes its first admin token there; the CLI reads it.
export BRISK_TOKEN_FILE=$DATA/admin.token

"$BRISK" up --data-dir "$DATA" --admin "$ADMIN" --invoke "$INVOKE" --grpc "${BRISK_GRPC:-127.0.0.1:9091}" \
  2> "$DATA/brisk.log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for _ in $(seq 1 100); do
  curl -fsS "http://$ADMIN/healthz" >/dev/null 2>&1 && curl -fsS "http://$INVOKE/healthz" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$DATA/brisk.log"; exit 1; }
  sleep 0.1
done

step() { printf '\n$ %s\n' "$*"; "$@"; }
step "$BRISK" fn deploy hello --builtin trace
step "$BRISK" invoke hello -v --data '{"ms": 50}'
step "$BRISK" invoke hello -v --data '{"ms": 50}'
# Functions need a token to be called (deploy with --public for none).
TOKEN=$(cat "$BRISK_TOKEN_FILE")
step curl -sS -H "Authorization: Bearer $TOKEN" -d '{"ms":10}' "http://$INVOKE/function/hello"
step curl -sS -H "Authorization: Bearer $TOKEN" -H 'Host: hello.brisk.local' "http://$INVOKE/"
step "$BRISK" fn list
step "$BRISK" status

if [ "${DEMO_EXIT:-0}" = 1 ]; then exit 0; fi
printf '\nbrisk is serving: admin http://%s  invoke http://%s (log: %s/brisk.log). Ctrl-C stops it.\n' "$ADMIN" "$INVOKE" "$DATA"
printf 'Admin token: %s (another shell: export BRISK_TOKEN_FILE=%s)\n' "$BRISK_TOKEN_FILE" "$BRISK_TOKEN_FILE"
wait "$pid"
