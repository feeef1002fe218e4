// Package gateway is brisk's front door for clusters with several data
// planes. Every data plane knows every endpoint, but a function's queue,
// concurrency accounting and autoscaling metrics live in whichever data plane
// its calls reach; for those to be whole (Dirigent §4.1) all calls of one
// function must reach the same one. The gateway does that by rendezvous
// hashing the function name over the healthy data planes and proxying the
// request there unchanged.
//
// The server side is net/http (HTTP/1.1 and h2c). Upstream, the handler's
// own goroutine writes the request and reads the reply (internal/h1, through
// internal/proxy) over pooled keep-alive connections to the data plane, as
// the data plane does to its sandboxes (upstream.go); protocol upgrades and
// requests with trailers take httputil.ReverseProxy. A request whose
// connection cannot be made goes to the function's next data plane.
package gateway
