// Package loadgen drives load against brisk the way the InVitro loader
// does (docs/benchmarks.md, "brisk replay"): an open-loop issuer of a
// workload.Schedule, a closed loop, an HTTP invoker, progress and plots.
// The workload model itself (traces, schedules, records, the papers'
// metrics) is internal/workload, which the simulator shares.
package loadgen
