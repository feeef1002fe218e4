// Package procs names, watches and spawns host processes for the worker's
// runtimes: a process identified by pid and start time, pidfd exit watches,
// and forks from a dedicated OS thread.
package procs
