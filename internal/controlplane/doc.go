// Package controlplane is brisk's control plane: the link and the cluster,
// with the admin surface mounted on them.
//
//   - the link, ControlPlane itself: the gRPC service workers and data
//     planes join and report to (server.go, identity.go, unreachable.go,
//     code.go), the sessions to the workers (link.go: KubeDirect's
//     handshake, idempotent creates, Tombstones) and the endpoint stream to
//     the data planes (watch.go);
//   - the cluster (cluster.go): the reconciler stepped under its lock, and
//     its outboxes; wire.go translates the wire's protobuf messages to and
//     from the reconciler's own types;
//   - the admin surface, the REST API, the dashboard and Dirigent's
//     registration, lives in internal/controlplane/admin: it reads and
//     changes the cluster only through admin.Cluster, which *Cluster
//     implements (query.go for its reads, clustersecrets.go), never its
//     lock or reconciler.
package controlplane
