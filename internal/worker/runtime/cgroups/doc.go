// Package cgroups creates, limits, watches and removes sandbox cgroups on
// cgroup v2 or v1 for the worker's runtimes.
package cgroups
