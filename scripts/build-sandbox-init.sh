#!/usr/bin/env bash
# Builds the native runtime's sandbox init (bin/brisk-sandbox-init) from
# internal/worker/runtime/native/nsinit/init.c: static, with no C library
# (its own _start and system calls), so that starting one costs about a
# tenth of a millisecond of CPU (docs/runtimes.md). amd64 only.
#
#   scripts/build-sandbox-init.sh OUT
set -euo pipefail
out=${1:?usage: build-sandbox-init.sh OUT}
src=$(cd "$(dirname "$0")/.." && pwd)/internal/worker/runtime/native/nsinit/init.c
"${CC:-cc}" -O2 -Wall -Wextra -Werror -std=gnu11 -DBRISK_INIT_STANDALONE \
  -static -nostdlib -ffreestanding -fno-stack-protector -fno-asynchronous-unwind-tables \
  -fno-pie -no-pie -s -o "$out.tmp" "$src"
mv "$out.tmp" "$out"
