// Package netpool keeps a pool of pre-created sandbox network endpoints (a
// named network namespace, a veth pair into a host bridge and an address) so
// that attaching a new sandbox to the network costs microseconds instead of
// milliseconds, however many sandboxes start at once (the PCPM idea).
package netpool
