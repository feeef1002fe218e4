// Package worker is the worker daemon: it serves the control plane's link
// sessions (the worker is the source of truth for its sandboxes), drives a
// sandbox runtime, probes readiness and reports state changes and heartbeats.
package worker
