// Package placement chooses the worker node for a new sandbox. Policies are
// pure values: they read a snapshot of nodes, take randomness from an injected
// *rand.Rand and do no I/O, so the control plane, the tests and the simulator
// make the same decision from the same inputs and seed.
package placement
