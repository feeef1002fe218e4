package briskv1

// LatencyBounds are the upper bounds, in seconds, of FunctionMetric's
// latency_buckets (brisk.proto); one more bucket counts longer calls. They
// span a sub-millisecond warm call to a function that runs for minutes.
// The data plane observes into these buckets and the control plane merges
// them, so both import this one table: a bucket's meaning is fixed on the
// wire, and changing a bound means a new field.
var LatencyBounds = [...]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
