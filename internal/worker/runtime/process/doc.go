// Package process is the "process" runtime: each sandbox is a host process in
// its own process group (and, as root, its own cgroup, which it is placed in
// before it runs and which is killed whole on teardown) listening on a
// loopback port, run as an unprivileged user with no_new_privs and a clean
// environment (sandbox.go; docs/security.md), and, as root, in a mount
// namespace of its own when its function has secrets (secrets.go). Its
// sandbox table survives a worker restart. Its cgroup and process helpers
// (packages cgroups and procs) are shared with the worker's other runtimes.
package process
