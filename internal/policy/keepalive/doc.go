// Package keepalive decides which idle sandboxes a worker removes: those
// idle too long (Expired), and, when a new sandbox needs memory that is not
// free, which idle ones to evict first (Evict). Two policies come from
// "FaasCache: Keeping Serverless Computing Alive with Greedy-Dual Caching"
// (Fuerst and Sharma, ASPLOS'21): a fixed TTL with LRU eviction, and
// Greedy-Dual-Size-Frequency keep-alive.
//
// Policies are pure values like the rest of internal/policy: the caller
// passes the time in, they read no clock, do no I/O and use no randomness,
// so the worker and the simulator evict the same sandboxes for the same
// inputs. A Policy is not safe for concurrent use; the worker serialises
// calls.
package keepalive
