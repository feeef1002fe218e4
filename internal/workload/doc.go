// Package workload is the workload model that the load generator and the
// simulator share: Azure Functions trace parsing, seeded InVitro-style
// schedules, per-invocation records and the papers' metrics
// (docs/benchmarks.md, "Metric definitions"). It does no network I/O, so
// the simulator that uses it stays a pure value stepped on a virtual clock.
package workload
