// Package native is the worker's fast isolated sandbox runtime. Each worker
// keeps a pool of pre-created shells — a network namespace with its address
// (netpool), a cgroup, and a parked init process (nsinit) already in fresh
// mount, PID, UTS and IPC namespaces — so that starting a sandbox is sending
// a shell its function: the init mounts the image's root file system (read
// only, under a private tmpfs upper layer) and, for a function with secrets,
// a read-only tmpfs holding them (secrets.go), drops to runc's default
// capabilities and seccomp profile and the image's user, and execs the
// entrypoint. docs/runtimes.md says why it is built this way.
package native
