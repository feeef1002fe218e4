// Package controlplane is brisk's control plane, in three parts over one
// core (the cluster: the reconciler stepped under its lock, the registry,
// the configuration):
//
//   - the link, ControlPlane itself: the gRPC service workers and data
//     planes join and report to (server.go, identity.go, unreachable.go),
//     the sessions to the workers (link.go: KubeDirect's handshake,
//     idempotent creates, Tombstones) and the endpoint stream to the data
//     planes (watch.go);
//   - the admin surface, adminAPI: the REST API and what it owns (admin.go
//     for functions, tokens.go, secrets.go, namespaces.go, triggers.go,
//     traffic.go, code.go, logs.go, dashboard.go, dirigent.go);
//   - the cluster (cluster.go), which both step; wire.go translates the
//     wire's protobuf messages to and from the reconciler's own types.
//
// The admin surface reads and changes the cluster only through the
// cluster's methods (query.go for its reads, clustersecrets.go), never its
// lock or reconciler: TestAdminSurfaceUsesTheClusterQueries keeps it so.
package controlplane
