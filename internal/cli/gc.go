package cli

import (
	"os"
	"runtime/debug"
)

// Garbage-collector defaults for brisk's long-running processes. The hot
// paths (proxying a call, applying an update) allocate little per call but
// at thousands of calls a second; with Go's default GOGC=100 the collector
// ran several times a second, and its marking on a 2-core machine was what
// set the warm path's tail: p99 at 4,000 req/s 4.3–20.7 ms with GOGC=100,
// 1.8–1.9 ms with GOGC=400 (docs/benchmarks.md). The live heaps are small
// (tens of MiB), so a 5× heap goal costs little memory; the soft memory
// limit makes the collector work harder only if the heap really grows.
const (
	defaultGCPercent   = 400
	defaultMemoryLimit = 2 << 30 // 2 GiB
)

// tuneGC applies the defaults unless the operator set GOGC or GOMEMLIMIT.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
}
