#!/usr/bin/env bash
# The standard benchmark set (docs/benchmarks.md): each run on its own local
# cluster, results under bench-results/<timestamp>/<run>/ and one report.md
# with every run's summary. BENCH_SCALE=small makes it a quick smoke run.
set -uo pipefail
cd "$(dirname "$0")/.."
BRISK=${BRISK:-./bin/brisk}
out=${BENCH_OUT:-bench-results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
report="$out/report.md"
dur=10s; reg=10000; scale_n=20000; scale_m=4000; scale_k=1000; replay_min=5
if [ "${BENCH_SCALE:-}" = small ]; then dur=2s; reg=200; scale_n=400; scale_m=80; scale_k=40; replay_min=1; fi

run() { # name, then the brisk arguments
  local name=$1; shift
  printf '\n## %s\n\n```\n$ brisk %s\n' "$name" "$*" >> "$report"
  "$BRISK" "$@" --out "$out/$name" >> "$report" 2>&1
  echo "(exit $?)" >> "$report"
  printf '```\n' >> "$report"
}

printf '# brisk benchmark report\n\n%s, %s CPUs, %s\n' "$(date -u)" "$(nproc)" "$("$BRISK" --help >/dev/null 2>&1 && git rev-parse --short HEAD 2>/dev/null)" > "$report"
for rate in 500 2000 4000; do
  run "warm-$rate" bench warm --local --rate "$rate" --duration "$dur" --compare-direct
done
# Saturation throughput: 64 closed-loop callers keep both paths at full
# CPU, brisk and direct taking turns in 5 rounds so host noise weighs on
# both; compare.throughput_ratio is the saturation figure.
run saturation bench warm --local --closed 64 --duration "$dur" --rounds 5 --compare-direct
# Overload: each path pushed past its knee by the open-loop generator
# (--force reports the run even though the generator falls behind). This
# measures collapse under a growing backlog too: it must shed, not crash.
# The rates suit a 2-core machine.
over_brisk=${OVERLOAD_BRISK:-20000}; over_direct=${OVERLOAD_DIRECT:-36000}
if [ "${BENCH_SCALE:-}" = small ]; then over_brisk=4000; over_direct=8000; fi
run overload-brisk bench warm --local --rate "$over_brisk" --duration "$dur" --force
run overload-direct bench warm --local --direct --rate "$over_direct" --duration "$dur" --force
for rate in 500 1000 2500; do
  run "cold-$rate" bench cold --local --rate "$rate" --duration "$dur" --workers 100
done
run register bench register --local --functions "$reg" --clients 16
run scale-one bench scale --local --functions 1 --sandboxes 800 --workers 80 --create-delay 200ms
run scale-many bench scale --local --functions "$scale_k" --sandboxes "$scale_n" --workers "$scale_m" --create-delay 200ms
traces=${TRACES:-traces}
if [ -d "$traces/azure_500" ]; then
  run replay-azure500 replay "$traces/azure_500" --minutes "$replay_min" --local
fi
echo "report: $report"
