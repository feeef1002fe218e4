// Package bench runs brisk's benchmarks — warm, cold, register, scale,
// asynchronous calls and trace replay — against an existing cluster or a
// one-process local one, and writes their per-call CSV, summary.json and
// plots.
package bench
