// Package dataplane is brisk's invocation entry: an HTTP reverse proxy that
// routes each request to a function by path or Host header, waits in a bounded
// per-function queue until a sandbox has a free concurrency slot, and keeps its
// endpoint view in sync with the control plane while reporting load back to it.
//
// Three parts are packages of their own: the invocation listener (front:
// connections, their states and time limits, the handoff to net/http; the
// data plane serves each connection's calls as its Session, fastpath.go),
// the routing table (endpoints: each function's settings and Ready
// sandboxes, a pure value stepped by the endpoint stream, shared with the
// simulator) and a function's wait line (queue: FIFO with asynchronous
// calls behind, slot handoff, timeouts).
package dataplane
