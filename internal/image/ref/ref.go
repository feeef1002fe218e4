// Package ref names the images brisk builds itself, without the image
// builder and containerd's client that package image links: what a
// runtime needs to know to pick one.
package ref

// LocalDomain is the domain of the references brisk gives images it builds.
// It resolves nowhere: such images reach workers only by import.
const LocalDomain = "brisk.local"

// Of is the default reference of an image built under name:
// brisk.local/<name>:latest.
func Of(name string) string { return LocalDomain + "/" + name + ":latest" }

// TraceName is the built-in trace function's image name.
const TraceName = "trace"

// Trace is the reference of the built-in trace function's image; the
// containerd runtime runs `--builtin trace` functions from it.
var Trace = Of(TraceName)

// Lang is the reference of the base image of lang ("python", "node"),
// which a worker builds from its own interpreter.
func Lang(lang string) string { return Of("lang-" + lang) }
