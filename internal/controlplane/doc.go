// Package controlplane is brisk's control plane: the durable function
// registry, the in-memory sandbox table rebuilt from workers, the autoscaler
// and placer loops, the worker link (KubeDirect-style handshake, idempotent
// creates, Tombstones), the endpoint stream to data planes, and the admin API.
package controlplane
