// Package loadgen replays Azure Functions traces and constant-rate load
// against brisk the way the InVitro loader does (LOADGEN.md §4, §5, §7):
// trace parsing, seeded schedules, an open-loop issuer, an HTTP invoker,
// per-invocation records and the papers' metrics and plots.
package loadgen
