package cli

import (
	"os"
	"runtime"
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

// goProcs is how many Go processors brisk runs on cpus CPUs: one spare,
// and at least minProcs. Every brisk process mixes short CPU bursts with
// blocking system calls (fdatasync in the registry's group commit) and
// network waits. With one processor per CPU and all of them busy, a
// goroutine coming back from a system call, or made ready by the network
// poller, queues behind whatever the busy processors run next; a spare
// processor lets it run at once and leaves the sharing of the CPUs to the
// kernel, which favours threads that have just woken. The floor of 4 is
// for the garbage collector: it gives a quarter of the processors to
// marking, and with 2 or 3 processors a quarter is not a whole one, so it
// marks in slices on every processor instead of on one dedicated processor
// — every goroutine then stalls a little during each collection, which was
// what set the cold-start tail. Measured on 2 CPUs (docs/benchmarks.md,
// "Runtime defaults"): registration 7.7–8.2k → 9.4–9.8k/s, warm p50 at
// 4,000 req/s 0.31–0.40 → 0.19–0.24 ms, saturation 10.8k → 12.4–14.6k
// req/s (3 processors); cold-start p99 ≤ 60 ms at 1,000/s in 12 of 14 runs
// with 4 processors, 8 of 14 with 3.
func goProcs(cpus int) int { return max(cpus+1, minProcs) }

const minProcs = 4

// tuneRuntime applies the defaults unless the operator set GOGC, GOMEMLIMIT
// or GOMAXPROCS.
func tuneRuntime() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// GOMAXPROCS(0) is Go's own default: the CPUs of the machine or
		// of the container's CPU limit.
		runtime.GOMAXPROCS(goProcs(runtime.GOMAXPROCS(0)))
	}
}
