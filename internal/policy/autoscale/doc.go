// Package autoscale holds brisk's scaling policies: the Knative Pod Autoscaler (KPA)
// and a Lambda-like synchronous policy. They are pure, deterministic values that the
// caller steps with an explicit now; they do no I/O, start no goroutines and never read the clock.
package autoscale
