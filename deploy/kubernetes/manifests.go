// Package manifests holds brisk's Kubernetes manifests, plain YAML, for
// `brisk k8s manifests|install` (internal/kubernetes/install renders them for a
// namespace, an image and a replica count, and adds the Secrets).
package manifests

import "embed"

// FS holds every *.yaml file of this directory.
//
//go:embed *.yaml
var FS embed.FS
