// Package loadgen replays Azure Functions traces and constant-rate load
// against brisk the way the InVitro loader does (docs/benchmarks.md,
// "brisk replay" and "Metric definitions"):
// trace parsing, seeded schedules, an open-loop issuer, an HTTP invoker,
// per-invocation records and the papers' metrics and plots.
package loadgen
