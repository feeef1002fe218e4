package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/bench"
)

func newBenchTriggers(g *globals) *cobra.Command {
	f := &benchFlags{async: true}
	cfg := bench.TriggersConfig{}
	c := &cobra.Command{
		Use:   "triggers",
		Short: "Triggers: cron firing lag into warm functions, and a NATS trigger's throughput",
		Long: `Measure triggers (docs/triggers.md) on a one-process cluster (--local), in two
phases:

 1. cron: --functions warm functions (one sandbox each), each with an
    "@every 1s" trigger, for --cron-duration: per tick, its scheduled time
    to its call's start in the sandbox (the attempt's start on the data
    plane, from the call's record, plus its queue wait there), and to the
    call queued.
 2. nats: --messages messages published at once to a JetStream stream on
    the cluster's NATS that a trigger of one function (--sandboxes warm
    sandboxes, async concurrency --concurrency) reads: messages made calls
    per second, and messages called per second (first publish to the last
    call's finish).

Nothing is asserted: the issue's goals are printed next to the measured
values. With --out DIR, summary.json.`,
		Example: `  brisk bench triggers --local --out results/triggers`,
		Args:    exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return usageError{fmt.Errorf("%w\nUsage: %s", err, c.UseLine())}
			}
			return f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
				_, text, err := bench.Triggers(ctx, cl, o, cfg)
				return text, err
			})
		},
	}
	f.register(c, 1, 40*time.Millisecond)
	fl := c.Flags()
	fl.IntVar(&cfg.Functions, "functions", 10, "cron phase: warm functions, one @every 1s trigger each (0: no cron phase)")
	fl.DurationVar(&cfg.CronDuration, "cron-duration", 30*time.Second, "cron phase: how long the triggers fire")
	fl.IntVar(&cfg.Messages, "messages", 50_000, "nats phase: messages published (0: no nats phase)")
	fl.IntVar(&cfg.Sandboxes, "sandboxes", 2, "nats phase: warm sandboxes of the function")
	fl.IntVar(&cfg.Concurrency, "concurrency", 64, "nats phase: the function's async.concurrency")
	fl.DurationVar(&cfg.Timeout, "timeout", 3*time.Minute, "give up when a phase's calls have not all finished by then")
	return c
}
