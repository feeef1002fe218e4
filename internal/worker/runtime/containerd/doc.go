// Package containerd is the "containerd" runtime: each sandbox is a runc
// container created through the system containerd from an OCI image, in a
// network namespace taken from a pre-created pool, with the function's
// resource limits as cgroup limits and a read-only root file system, and
// its function's secrets bound read-only from the state directory
// (secrets.go).
package containerd
