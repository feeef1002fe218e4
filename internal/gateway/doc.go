// Package gateway is brisk's front door for clusters with several data
// planes. Every data plane knows every endpoint, but a function's queue,
// concurrency accounting and autoscaling metrics live in whichever data plane
// its calls reach; for those to be whole (Dirigent §4.1) all calls of one
// function must reach the same one. The gateway does that by rendezvous
// hashing the function name over the healthy data planes and proxying the
// request there unchanged.
package gateway
