// Package loadbalance picks the sandbox endpoint for one request on the data
// plane hot path. Picks reserve a slot on a lock-free per-endpoint counter,
// allocate nothing, and take randomness from an injected source, so the proxy
// and the simulator share one implementation.
package loadbalance
