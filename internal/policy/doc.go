// Package policy holds brisk's scheduling policies: pure, deterministic state machines with injected time and randomness and no I/O, shared by the real system, the tests and the simulator. docs/policies.md describes each of them.
package policy
