// Package async is brisk's durable queue of asynchronous invocations, kept
// in NATS JetStream: a call is accepted (202) only once JetStream has
// stored it, runs at least once through the data plane's normal invocation
// path, is retried with exponential back-off after platform failures (and
// after the function's own 5xx when its spec asks), and ends as a status
// record with its result, in the dead-letter stream when it did not
// succeed, and optionally as a callback POST.
//
// Layout in JetStream (docs/architecture.md, "Asynchronous calls"):
//   - stream BRISK_CALLS, subjects brisk.calls.FUNCTION.ID (FUNCTION one
//     token: NAME.NAMESPACE as NAME:NAMESPACE), work-queue
//     retention: the calls waiting or running; one durable pull consumer
//     shared by every data plane, so each call is delivered to one of them;
//   - stream BRISK_DEAD, subjects brisk.dead.FUNCTION.ID: calls that failed
//     for good, kept for `brisk calls retry`;
//   - key-value bucket BRISK_CALL_STATUS: one status record per call id,
//     with its result, kept for the result retention.
package async
