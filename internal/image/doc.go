// Package image builds single-layer OCI images from a static binary or a
// directory, writes them as OCI image layouts and archives, and imports
// archives into containerd, so functions run in containers without a Docker
// engine or a registry.
package image
