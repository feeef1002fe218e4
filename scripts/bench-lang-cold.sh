#!/usr/bin/env bash
# Cold starts of a Python function (an unmodified http.server, which looks
# its address up in DNS when it binds) beside the Go trace function, on a
# local cluster of the given runtime: N functions of each, each called once
# (every call a cold start, request in to reply out, measured by curl), the
# two kinds interleaved. Prints p50 and max per kind.
#
#   scripts/bench-lang-cold.sh [RUNTIME] [N]      # default: native 20
#
# The sandboxes' DNS forwarder relays to 127.0.0.1:9, where nothing
# answers: it answers SERVFAIL at once, as a resolver that does not know a
# reverse name answers, and no query leaves the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
RT=${1:-native}
N=${2:-20}
BRISK=${BRISK:-./bin/brisk}
DIR=$(mktemp -d /tmp/brisk-langcold.XXXXXX)
chmod 755 "$DIR"
ADMIN=127.0.0.1:${ADMIN_PORT:-19190} INVOKE=127.0.0.1:${INVOKE_PORT:-18180} GRPC=127.0.0.1:${GRPC_PORT:-19191}
export BRISK_ADMIN=$ADMIN BRISK_INVOKE=$INVOKE BRISK_TOKEN_FILE=$DIR/data/admin.token
extra=()
[ "$RT" = native ] && extra=(--net-dns-upstreams 127.0.0.1:9)
"$BRISK" up --runtime "$RT" "${extra[@]}" --data-dir "$DIR/data" --admin "$ADMIN" --invoke "$INVOKE" --grpc "$GRPC" \
  >"$DIR/out" 2>"$DIR/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  curl -fsS "http://$INVOKE/healthz" >/dev/null 2>&1 && [ -s "$BRISK_TOKEN_FILE" ] && break
  kill -0 $pid 2>/dev/null || { cat "$DIR/log"; exit 1; }
  sleep 0.1
done
cat >"$DIR/server.py" <<'EOF'
import http.server, os

class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        body = b"hello from python\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = reply
    def log_message(self, *args):
        pass

http.server.HTTPServer(("0.0.0.0", int(os.environ["PORT"])), Handler).serve_forever()
EOF
chmod 644 "$DIR/server.py"
for i in $(seq "$N"); do
  "$BRISK" fn deploy "py$i" --command "/usr/bin/python3 $DIR/server.py" --port 8080 --public >/dev/null
  "$BRISK" fn deploy "go$i" --builtin trace --public >/dev/null
done
: >"$DIR/times"
for i in $(seq "$N"); do
  for kind in py go; do
    t=$(curl -sS -o /dev/null -w '%{http_code} %{time_total}' -d '{}' "http://$INVOKE/function/$kind$i")
    echo "$kind $t" >>"$DIR/times"
  done
done
python3 - "$DIR/times" "$RT" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
for kind in ("py", "go"):
    ts = sorted(float(t) * 1000 for k, code, t in rows if k == kind and code == "200")
    bad = sum(1 for k, code, t in rows if k == kind and code != "200")
    name = {"py": "Python http.server", "go": "Go trace builtin"}[kind]
    print(f"{sys.argv[2]:8} {name:20} n={len(ts)} failed={bad} p50={statistics.median(ts):.1f} ms max={max(ts):.1f} ms")
EOF
