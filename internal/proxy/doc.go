// Package proxy is brisk's upstream hop over HTTP/1.1, the one the data
// plane (to its sandboxes) and the gateway (to its data planes) both take:
// per-address pools of keep-alive connections (Pool, Conn) used on the
// handler's own goroutine, with h1 reading the reply head; the request and
// body writers' pieces; relaying a reply (interim replies, small bodies
// read before the status goes out, chunked bodies and trailers); and the
// rules for hop-by-hop headers and for when a call may be sent again.
// httputil.ReverseProxy over http.Transport hands every call to two
// goroutines per connection and clones the request: that made the data
// plane cost as much CPU per call as the load generator and the sandbox
// together (docs/benchmarks.md, "Warm calls").
package proxy
