package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/bench"
)

func newBenchAsync(g *globals) *cobra.Command {
	f := &benchFlags{async: true}
	cfg := bench.AsyncConfig{}
	c := &cobra.Command{
		Use:   "async",
		Short: "Asynchronous calls: accept rate, queueing overhead at light load, backlog drain rate against synchronous throughput",
		Long: `Measure asynchronous calls (POST /async-function/NAME) of one trace
function with --sandboxes pre-warmed sandboxes, in four phases:

 1. accept: --clients clients submit as fast as they can for
    --accept-duration (at most --accept-max calls): calls accepted per
    second and the client's time to the 202 (over plain HTTP/1.1 the
    clients use brisk's own wire code, lighter than net/http's client);
    then every call is awaited.
    Then (1b, paced) the clients send on a fixed schedule of --accept-rate
    calls per second for as long: the accept latency at that load (from a
    call's scheduled time when every client was busy then, so a slow
    server is not hidden by fewer sends). At saturation a closed loop's
    latency is the clients queueing behind one another: 16 clients at
    10,000/s wait 1.6 ms on average whatever the server does.
 2. light: --light-calls calls, one at a time --light-gap apart, to the
    warm function: accept to function start, from each call's record
    (started_at − submitted_at, plus the data plane's queue wait from the
    attempt's X-Brisk-Timing queue_us).
 3. drain: a backlog of --backlog calls submitted at once; calls drained
    per second from the first submit to the last finish (server clock).
 4. sync: --concurrency closed-loop synchronous callers of the same
    function for --sync-duration; drain rate / sync throughput. The
    function's async.concurrency is --concurrency too, so both have as many
    calls in flight.

Each call asks for --exec-ms of work (body {"ms": N}). With --local the
one-process cluster gets an embedded NATS server with JetStream in its
temporary directory, as brisk up does; without it the cluster at
--invoke-url/--admin-url must have asynchronous calls enabled. Nothing is
asserted: the issue's goals are printed next to the measured values. With
--out DIR, summary.json.`,
		Example: `  brisk bench async --local --out results/async
  brisk bench async --local --backlog 100000 --accept-duration 20s --accept-max 200000`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			cfg.Clients = f.clients
			if err := cfg.Validate(); err != nil {
				return usageError{fmt.Errorf("%w\nUsage: %s", err, c.UseLine())}
			}
			return f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
				_, text, err := bench.Async(ctx, cl, o, cfg)
				return text, err
			})
		},
	}
	f.register(c, 1, 40*time.Millisecond)
	fl := c.Flags()
	fl.Lookup("clients").Usage = "clients submitting at once in the accept and backlog phases (and registering)"
	fl.BoolVar(&f.natsSyncAlways, "nats-sync-always", false, "with --local: the embedded JetStream fsyncs every write before a call is accepted")
	fl.DurationVar(&cfg.AcceptDuration, "accept-duration", 10*time.Second, "accept phase: how long the clients submit")
	fl.IntVar(&cfg.AcceptMax, "accept-max", 100_000, "accept phase: at most this many calls")
	fl.Float64Var(&cfg.AcceptRate, "accept-rate", 10_000, "paced accept phase: calls per second offered, on a fixed schedule")
	fl.IntVar(&cfg.LightCalls, "light-calls", 50, "light phase: calls, one at a time")
	fl.DurationVar(&cfg.LightGap, "light-gap", 20*time.Millisecond, "light phase: pause between a call's 202 and the next submit")
	fl.IntVar(&cfg.Backlog, "backlog", 20_000, "drain phase: calls submitted at once, then drained")
	fl.IntVar(&cfg.Concurrency, "concurrency", 64, "the function's async.concurrency, and the sync phase's closed-loop callers")
	fl.DurationVar(&cfg.SyncDuration, "sync-duration", 10*time.Second, "sync phase: measured duration")
	fl.DurationVar(&cfg.SyncWarmup, "sync-warmup", time.Second, "sync phase: unmeasured calls first")
	fl.IntVar(&cfg.ExecMs, "exec-ms", 1, "work each call asks for, in ms")
	fl.IntVar(&cfg.Sandboxes, "sandboxes", 2, "pre-warmed sandboxes of the function (scaling min = max; unlimited concurrency each)")
	fl.DurationVar(&cfg.Timeout, "timeout", 3*time.Minute, "give up when a phase's calls have not all finished by then")
	return c
}
