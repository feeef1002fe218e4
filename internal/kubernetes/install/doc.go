// Package install deploys brisk on a Kubernetes cluster: it renders the
// plain manifests of deploy/kubernetes for a namespace, an image and
// replica counts (Render), makes the cluster's Secrets (the cluster CA and
// the first admin and join tokens) once, and applies everything with
// server-side apply through the dynamic client (Install: one per cluster,
// never in Kubernetes' own namespaces), or removes it (Uninstall, which
// first takes the Function controller's finalizer off every Function
// object). BuildImage builds the image those manifests run: brisk and
// the native runtime's sandbox init, with no Docker engine.
package install
