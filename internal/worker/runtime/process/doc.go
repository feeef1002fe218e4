// Package process is the "process" runtime: each sandbox is a host process in
// its own process group (and, as root, its own cgroup) listening on a
// loopback port. Its sandbox table survives a worker restart.
package process
