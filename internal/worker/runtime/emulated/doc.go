// Package emulated is the "emulated" runtime for scale tests: thousands of
// emulated worker nodes live in one process, their sandboxes are entries in a
// shared table, and one HTTP listener serves them all by running the trace
// function in sleep mode.
package emulated
