#!/usr/bin/env bash
# check-readme.sh — run every shell command of README.md against a local
# cluster (make readme-check; test/e2e TestREADMECommands runs it in CI).
#
# Commands are the lines of the README's fenced ```sh, ```bash and ```shell
# blocks (in ```console blocks, the lines after "$ "), run in order, each in
# a fresh bash that inherits the variables the earlier ones set (T=$(...) and
# the like). Each must exit 0. The check starts the cluster itself
# (`brisk up` with a temporary --data-dir and free loopback ports, in the
# background) and stops only that process when it ends.
#
# What is not run is said in the README, by a marker before the block:
#
#   <!-- readme-check: skip REASON -->                 the next block is not run
#   <!-- readme-check: skip-line `PREFIX` REASON -->   its lines starting with PREFIX are not run
#   <!-- readme-check: needs TOOL `PREFIX` -->         those lines run only when TOOL is on PATH
#   <!-- readme-check: exit N `PREFIX` -->             those lines must exit N, not 0
#
# A marker that matches no command is an error, as is one that is not
# followed by a block. The rewrites below (the substitution table) are the
# only changes made to a command before it runs.
#
# Environment: BRISK (default ./bin/brisk: make build), README (default
# README.md), CMD_TIMEOUT (seconds per command, default 60), VERBOSE=1
# (print every command's output, not only a failing one's). With --list it
# prints what it would run and skip, and starts nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
README=${README:-$ROOT/README.md}
RNAME=$(basename "$README")
BRISK=${BRISK:-$ROOT/bin/brisk}
CMD_TIMEOUT=${CMD_TIMEOUT:-60}
VERBOSE=${VERBOSE:-0}

case $BRISK in /*) ;; *) BRISK=$ROOT/$BRISK ;; esac
if [ ! -x "$BRISK" ]; then
  echo "check-readme: no brisk binary at $BRISK (make build, or BRISK=/path/to/brisk)" >&2
  exit 1
fi
for tool in curl timeout; do
  command -v "$tool" >/dev/null || { echo "check-readme: $tool is not installed" >&2; exit 1; }
done
# `brisk ...` in the README is this binary (and brisk-trace beside it).
export PATH="$(dirname "$BRISK"):$PATH"

# ---------------------------------------------------------------------------
# Parse the README into commands: one record per command,
# LINE<US>ACTION<US>ARG<US>COMMAND, ACTION run|skip (ARG: the expected exit
# code or the reason).
US=$'\x1f'
declare -a CMDS=()
declare -a pending=() # markers waiting for their block
parse_errors=0
perr() { echo "check-readme: $README:$1: $2" >&2; parse_errors=$((parse_errors + 1)); }

marker_re='^[[:space:]]*<!--[[:space:]]*readme-check:[[:space:]]*(.*[^[:space:]])[[:space:]]*-->[[:space:]]*$'
skipline_re='^skip-line[[:space:]]+`([^`]+)`[[:space:]]+(.+)$'
skip_re='^skip[[:space:]]+(.+)$'
needs_re='^needs[[:space:]]+([^[:space:]`]+)[[:space:]]+`([^`]+)`$'
exit_re='^exit[[:space:]]+([0-9]+)[[:space:]]+`([^`]+)`$'
fence_re='^[[:space:]]*```[[:space:]]*([A-Za-z0-9_-]*)'

# The block being read: its language ("" when outside one), its markers.
lang="" block_skip="" block_line=0
declare -a lmarkers=() # "KIND<US>PREFIX<US>ARG<US>MARKERLINE<US>USED"

flush_block_markers() {
  local m kind prefix arg mline used
  for m in ${lmarkers[@]+"${lmarkers[@]}"}; do
    IFS=$US read -r kind prefix arg mline used <<<"$m"
    [ "$used" = 1 ] || perr "$mline" "marker \`$prefix\` matches no command of the block at line $block_line"
  done
  lmarkers=()
}

add_command() { # $1 line, $2 command text
  local line=$1 cmd=$2 action=run arg=0 i m kind prefix marg mline used
  if [ -n "$block_skip" ]; then
    action=skip arg=$block_skip
  else
    for i in "${!lmarkers[@]}"; do
      IFS=$US read -r kind prefix marg mline used <<<"${lmarkers[$i]}"
      [[ $cmd == "$prefix"* ]] || continue
      lmarkers[$i]="$kind$US$prefix$US$marg$US$mline${US}1"
      case $kind in
        skip-line) action=skip arg=$marg ;;
        needs) command -v "$marg" >/dev/null || { action=skip arg="$marg is not installed (scripts/setup.sh --test installs it)"; } ;;
        exit) [ "$action" = run ] && arg=$marg ;;
      esac
    done
  fi
  CMDS+=("$line$US$action$US$arg$US$cmd")
}

lineno=0 cont="" cont_line=0
while IFS= read -r raw || [ -n "$raw" ]; do
  lineno=$((lineno + 1))
  if [ -z "$lang" ]; then
    if [[ $raw =~ $marker_re ]]; then
      pending+=("$lineno$US${BASH_REMATCH[1]}")
    elif [[ $raw =~ $fence_re ]]; then
      lang=${BASH_REMATCH[1]:-none} block_line=$lineno block_skip="" lmarkers=()
      case $lang in sh | bash | shell | console) ;; *) lang=other ;; esac
      for p in ${pending[@]+"${pending[@]}"}; do
        mline=${p%%"$US"*} body=${p#*"$US"}
        if [ "$lang" = other ]; then
          perr "$mline" "readme-check marker before a block that is not shell"
        elif [[ $body =~ $skipline_re ]]; then
          lmarkers+=("skip-line$US${BASH_REMATCH[1]}$US${BASH_REMATCH[2]}$US$mline${US}0")
        elif [[ $body =~ $needs_re ]]; then
          lmarkers+=("needs$US${BASH_REMATCH[2]}$US${BASH_REMATCH[1]}$US$mline${US}0")
        elif [[ $body =~ $exit_re ]]; then
          lmarkers+=("exit$US${BASH_REMATCH[2]}$US${BASH_REMATCH[1]}$US$mline${US}0")
        elif [[ $body =~ $skip_re ]]; then
          block_skip=${BASH_REMATCH[1]}
        else
          perr "$mline" "unknown readme-check marker: $body"
        fi
      done
      pending=()
    elif [ ${#pending[@]} -gt 0 ] && [[ -n ${raw//[[:space:]]/} ]]; then
      perr "${pending[0]%%"$US"*}" "readme-check marker not followed by a code block"
      pending=()
    fi
    continue
  fi
  # Inside a block.
  if [[ $raw =~ ^[[:space:]]*\`\`\`[[:space:]]*$ ]]; then
    [ -n "$cont" ] && perr "$cont_line" "command continued past the end of its block"
    cont=""
    [ "$lang" != other ] && flush_block_markers
    lang=""
    continue
  fi
  [ "$lang" = other ] && continue
  text=$raw
  if [ -z "$cont" ]; then
    text="${text#"${text%%[![:space:]]*}"}" # leading blanks
    if [ "$lang" = console ]; then
      [[ $text == '$ '* ]] || continue # output, not a command
      text=${text#'$ '}
    fi
    [[ -z $text || $text == '#'* ]] && continue
    cont_line=$lineno
  fi
  if [[ $text == *\\ ]]; then # continued on the next line
    cont+="${text%\\}"$'\n'
    continue
  fi
  add_command "$cont_line" "$cont$text"
  cont=""
done <"$README"
[ -n "$lang" ] && perr "$block_line" "code block not closed"
[ ${#pending[@]} -gt 0 ] && perr "${pending[0]%%"$US"*}" "readme-check marker not followed by a code block"
if [ "$parse_errors" -gt 0 ]; then exit 1; fi
nrun=0
for c in ${CMDS[@]+"${CMDS[@]}"}; do
  IFS=$US read -r _ action _ <<<"$c"
  [ "$action" = run ] && nrun=$((nrun + 1))
done
if [ "$nrun" -eq 0 ]; then
  echo "check-readme: found no command to run in $README" >&2
  exit 1
fi
if [ "${1:-}" = --list ]; then
  for c in "${CMDS[@]}"; do
    IFS=$US read -r line action arg _ <<<"$c"
    printf '%s\t%s:%s\t%s\t%s\n' "$action" "$RNAME" "$line" "${c#*"$US"*"$US"*"$US"}" "$arg"
  done
  exit 0
fi

# ---------------------------------------------------------------------------
# The cluster.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/brisk-readme.XXXXXX")
pid="" child=""
# ours: $1 is still a child of this shell (not a pid reused after it ended).
ours() {
  local stat
  [ -n "$1" ] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  set -- ${stat##*) }
  [ "${2:-}" = "$$" ]
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  ours "$child" && kill -TERM "$child" 2>/dev/null && wait "$child" 2>/dev/null
  if ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do ours "$pid" || break; sleep 0.2; done
    ours "$pid" && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# A loopback port nothing listens on, below the kernel's range for outgoing
# connections when there is room (as test/e2e's freePort picks them).
used_ports=" "
free_port() { # sets PORT
  local lo=0 hi p span
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=0
  if [ "$lo" -gt 11000 ]; then span=$((lo - 10000)); else span=50000; fi
  for _ in $(seq 1 100); do
    p=$((10000 + ((RANDOM << 15) | RANDOM) % span))
    [[ $used_ports == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      used_ports+="$p "
      PORT=$p
      return 0
    fi
  done
  return 1
}

healthy() { curl -fsS -o /dev/null "http://$1/healthz" 2>/dev/null; }

start_cluster() {
  local try
  for try in 1 2 3; do
    free_port && ADMIN=127.0.0.1:$PORT && free_port && INVOKE=127.0.0.1:$PORT && free_port && GRPC=127.0.0.1:$PORT ||
      { echo "cluster: no free loopback port found" >&2; return 1; }
    DATA=$WORK/data$try
    LOG=$WORK/brisk$try.log
    "$BRISK" up --data-dir "$DATA" --admin "$ADMIN" --invoke "$INVOKE" --grpc "$GRPC" >"$LOG" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
      if healthy "$ADMIN" && healthy "$INVOKE" && [ -s "$DATA/admin.token" ]; then
        echo "cluster: brisk up (pid $pid) admin $ADMIN invoke $INVOKE data $DATA"
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    echo "cluster: brisk up did not come up (try $try):" >&2
    tail -n 20 "$LOG" >&2
    ours "$pid" && kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=""
  done
  return 1
}
start_cluster || exit 1

# The commands find this cluster as the README's would find `brisk up`'s:
# through the CLI's environment. Nothing of the caller's may redirect them.
unset BRISK_TOKEN BRISK_CA_CERT BRISK_JOIN_TOKEN
# Nor send anything off this machine: no span exporter, pprof listener or
# proxy of the caller's (curl would send the token through a proxy).
unset BRISK_PPROF OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
export BRISK_ADMIN=$ADMIN BRISK_INVOKE=$INVOKE BRISK_TOKEN_FILE=$DATA/admin.token
# No aws configuration of the caller's (a default region, say) may hide a
# command that needs its own.
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true
unset AWS_REGION AWS_DEFAULT_REGION AWS_PROFILE AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN
mkdir -p "$WORK/cwd" # commands run here: files they write (out.json, registry.db) go with it

# The substitution table: the only rewrites of a command, each with its reason.
rewrite() {
  local c=$1
  # brisk up's default addresses, which the README writes: this cluster listens on free ports.
  c=${c//127.0.0.1:8080/$INVOKE}
  c=${c//127.0.0.1:9090/$ADMIN}
  # The README's callback example names a public host: here the result goes
  # to a closed loopback port (which brisk refuses to call back by default),
  # so that no traffic leaves the machine.
  c=${c//https:\/\/example.com\/hook/http://127.0.0.1:9/hook}
  # curl exits 0 on an HTTP error status; the check wants the status to count.
  [[ $c == 'curl '* ]] && c="curl --fail-with-body -sS ${c#curl }"
  printf '%s' "$c"
}

# ---------------------------------------------------------------------------
# Run them. Variables a command sets (set -a exports them) and its working
# directory are saved for the next; each runs with a timeout, its output in
# a file.
STATE=$WORK/state.sh
printf 'cd %q\n' "$WORK/cwd" >"$STATE"
runner='
state=$1; shift
. "$state" || exit 99
set -a
eval "$1"
rc=$?
set +a
{ export -n SHLVL OLDPWD rc 2>/dev/null; export -p; printf "cd %q\n" "$PWD"; } >"$state.new" && mv -f "$state.new" "$state"
exit $rc'
ran=0 skipped=0 last_reason=""
for c in "${CMDS[@]}"; do
  IFS=$US read -r line action arg cmd <<<"$c"
  # read stops at a newline: a continued command keeps the rest.
  cmd=${c#*"$US"*"$US"*"$US"}
  if [ "$action" = skip ]; then
    printf 'SKIP %s:%s: %s\n' "$RNAME" "$line" "$cmd"
    # The reason once for a run of commands skipped for the same one.
    [ "$arg" != "$last_reason" ] && printf '     (skipped: %s)\n' "$arg"
    last_reason=$arg
    skipped=$((skipped + 1))
    continue
  fi
  last_reason=""
  run=$(rewrite "$cmd")
  printf '$ %s\n' "$cmd"
  [ "$run" != "$cmd" ] && printf '  (run as: %s)\n' "$run"
  out=$WORK/out
  start=$(date +%s.%N)
  timeout --kill-after=5 "$CMD_TIMEOUT" bash -c "$runner" check-readme "$STATE" "$run" >"$out" 2>&1 </dev/null &
  child=$!
  wait "$child"
  rc=$?
  child=""
  took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }')
  ran=$((ran + 1))
  if [ "$rc" -ne "$arg" ]; then
    printf '  exit %s (want %s) after %ss\n' "$rc" "$arg" "$took"
    [ "$rc" -eq 124 ] && printf '  (timed out after %ss)\n' "$CMD_TIMEOUT"
    echo "--- its output (last 40 lines):"
    tail -n 40 "$out"
    echo "--- brisk up's log (last 20 lines):"
    tail -n 20 "$LOG"
    echo "FAIL: $RNAME:$line: $cmd"
    exit 1
  fi
  printf '  exit %s, %ss\n' "$rc" "$took"
  if [ "$VERBOSE" = 1 ]; then sed 's/^/  | /' "$out"; fi
done
echo "README check passed: $ran commands ran, $skipped skipped by the README's readme-check markers"
