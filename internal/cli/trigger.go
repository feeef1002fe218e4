package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newTrigger(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "trigger",
		Short: "Manage triggers: functions called on a schedule or for NATS messages",
		Long: `A trigger calls a function on its own: on a cron schedule, or for every
message on a NATS subject. Each firing is an asynchronous call (brisk calls
shows it, with retries, dead letters and results as for any), whose id is
derived from the trigger and its tick or message, so a firing is queued once
even when a control plane restarts or hands over. A trigger lives in its
function's namespace and is deleted with the function (docs/triggers.md).`,
	}
	c.AddCommand(newTriggerSet(g, "create"), newTriggerSet(g, "update"), newTriggerList(g), newTriggerGet(g), newTriggerDelete(g), newTriggerPause(g, true), newTriggerPause(g, false))
	return c
}

func newTriggerSet(g *globals, verb string) *cobra.Command {
	var t spec.Trigger
	var cronExpr, tz, payload, payloadFile, contentType, catchUp, start string
	var subject, natsURL, creds, stream string
	short := "Create a trigger"
	if verb == "update" {
		short = "Replace a trigger's spec (it keeps its id and counts; a new schedule or subject counts from now)"
	}
	c := &cobra.Command{
		Use:   verb + " NAME --function FN (--cron EXPR | --nats SUBJECT)",
		Short: short,
		Example: `  brisk trigger create nightly --function report --cron "0 2 * * *" --tz Europe/Berlin
  brisk trigger create tick --function probe --cron "@every 30s" --payload '{"check":"all"}' --content-type application/json
  brisk trigger create sync --function backup --cron "@every 6h" --start 2026-12-01T03:15:00Z
  brisk trigger create orders --function ship --nats 'default.orders.>'
  brisk trigger create orders --function ship --nats orders.created --nats-url nats://10.0.0.5:4222 --credentials-secret nats-creds --stream ORDERS`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			t.Name = args[0]
			switch {
			case cronExpr != "" && subject != "":
				return usageError{errors.New("give --cron or --nats, not both")}
			case cronExpr != "":
				if natsURL != "" || creds != "" || stream != "" {
					return usageError{errors.New("--nats-url, --credentials-secret and --stream are for --nats triggers")}
				}
				if payloadFile != "" {
					if payload != "" {
						return usageError{errors.New("give --payload or --payload-file, not both")}
					}
					b, err := readLimitedN(payloadFile, spec.MaxTriggerPayload)
					if err != nil {
						return err
					}
					payload = string(b)
				}
				t.Cron = &spec.CronSource{Schedule: cronExpr, TimeZone: tz, Payload: payload, ContentType: contentType, CatchUp: catchUp}
				if start != "" {
					at, err := time.Parse(time.RFC3339, start)
					if err != nil {
						return usageError{fmt.Errorf("--start %q: want an RFC 3339 time (2026-12-01T03:15:00Z)", start)}
					}
					t.Cron.Start = at.UTC()
				}
			case subject != "":
				if tz != "" || payload != "" || payloadFile != "" || contentType != "" || catchUp != "" || start != "" {
					return usageError{errors.New("--tz, --payload, --payload-file, --content-type, --catch-up and --start are for --cron triggers")}
				}
				t.NATS = &spec.NATSSource{Subject: subject, URL: natsURL, CredentialsSecret: creds, Stream: stream}
			default:
				return usageError{errors.New("give --cron EXPR or --nats SUBJECT")}
			}
			if t.Function == "" {
				return usageError{errors.New("--function is required")}
			}
			var v *api.TriggerView
			var err error
			if verb == "update" {
				v, err = g.client().UpdateTrigger(c.Context(), t)
			} else {
				v, err = g.client().CreateTrigger(c.Context(), t)
			}
			if err != nil {
				return err
			}
			fmt.Printf("trigger %s/%s %sd: %s\n", v.Namespace, v.Name, verb, describeTrigger(v))
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&t.Function, "function", "", "the function to call (of the trigger's namespace)")
	fl.StringVarP(&t.Namespace, "namespace", "n", "", "namespace (default: the token's, else default)")
	fl.StringVar(&t.Path, "path", "", "path the calls go to (default /)")
	fl.StringVar(&cronExpr, "cron", "", `schedule: five fields (minute hour day-of-month month day-of-week), @hourly, @daily..., or "@every 5m"`)
	fl.StringVar(&tz, "tz", "", "IANA time zone the schedule is read in (default UTC)")
	fl.StringVar(&payload, "payload", "", "body of each scheduled call")
	fl.StringVar(&payloadFile, "payload-file", "", "read the body of each scheduled call from this file")
	fl.StringVar(&contentType, "content-type", "", "Content-Type of the payload (default text/plain)")
	fl.StringVar(&start, "start", "", `when the schedule begins (RFC 3339): no tick before it; "@every D" ticks at it and every D after`)
	fl.StringVar(&catchUp, "catch-up", "", "ticks missed while no control plane ran: once (default: the latest fires once on recovery) or skip")
	fl.StringVar(&subject, "nats", "", "NATS subject (wildcards * and >); on the cluster's NATS it lies under the namespace: NAMESPACE.SUBJECT")
	fl.StringVar(&natsURL, "nats-url", "", "external NATS server (nats://host:port); default: the cluster's")
	fl.StringVar(&creds, "credentials-secret", "", "secret with the external server's credentials: user:password, a token, or a .creds file")
	fl.StringVar(&stream, "stream", "", "JetStream stream holding the subject: a durable consumer, messages acknowledged once queued (at least once)")
	return c
}

func readLimitedN(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// describeTrigger is one line saying what a trigger does.
func describeTrigger(v *api.TriggerView) string {
	switch {
	case v.Cron != nil:
		s := fmt.Sprintf("calls %s on %q", v.Function, v.Cron.Schedule)
		if v.Cron.TimeZone != "" {
			s += " (" + v.Cron.TimeZone + ")"
		}
		if !v.Status.Next.IsZero() {
			s += ", next " + v.Status.Next.UTC().Format(time.RFC3339)
		}
		return s
	case v.NATS != nil:
		where := "the cluster's NATS"
		if v.NATS.URL != "" {
			where = v.NATS.URL
		}
		s := fmt.Sprintf("calls %s for each message on %s at %s", v.Function, v.NATS.Subject, where)
		if v.NATS.Stream != "" {
			s += " (stream " + v.NATS.Stream + ")"
		}
		return s
	}
	return "calls " + v.Function
}

func newTriggerList(g *globals) *cobra.Command {
	var asJSON bool
	var ns, fn string
	c := &cobra.Command{
		Use:   "list",
		Short: "List triggers",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			ts, err := g.client().Triggers(c.Context(), ns, fn)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ts)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "NAMESPACE\tNAME\tFUNCTION\tKIND\tSOURCE\tSTATE\tFIRED\tFAILED\tNEXT\n")
			for i := range ts {
				v := &ts[i]
				src, next := "", "-"
				switch {
				case v.Cron != nil:
					src = v.Cron.Schedule
				case v.NATS != nil:
					src = v.NATS.Subject
				}
				if !v.Status.Next.IsZero() {
					next = v.Status.Next.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", v.Namespace, v.Name, v.Function, v.Kind(), src, v.Status.State, v.Status.Fired, v.Status.Failed, next)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().StringVarP(&ns, "namespace", "n", "", "namespace (default: the token's, else every one it sees)")
	c.Flags().StringVar(&fn, "function", "", "only this function's triggers")
	return c
}

func newTriggerGet(g *globals) *cobra.Command {
	var ns string
	c := &cobra.Command{
		Use: "get NAME", Short: "Show a trigger and what it has done (JSON)", Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			v, err := g.client().Trigger(c.Context(), ns, args[0])
			if err != nil {
				return err
			}
			return printJSON(v)
		},
	}
	c.Flags().StringVarP(&ns, "namespace", "n", "", "namespace (default: the token's, else default)")
	return c
}

func newTriggerDelete(g *globals) *cobra.Command {
	var ns string
	c := &cobra.Command{
		Use: "delete NAME", Short: "Delete a trigger", Aliases: []string{"rm"}, Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := g.client().DeleteTrigger(c.Context(), ns, args[0]); err != nil {
				return err
			}
			fmt.Printf("trigger %s deleted\n", args[0])
			return nil
		},
	}
	c.Flags().StringVarP(&ns, "namespace", "n", "", "namespace (default: the token's, else default)")
	return c
}

func newTriggerPause(g *globals, pause bool) *cobra.Command {
	var ns string
	verb, short := "resume", "Resume a paused trigger (a cron trigger fires from its next tick)"
	if pause {
		verb, short = "pause", "Pause a trigger (a JetStream trigger's messages wait in their stream)"
	}
	c := &cobra.Command{
		Use: verb + " NAME", Short: short, Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cl := g.client()
			var v *api.TriggerView
			var err error
			if pause {
				v, err = cl.PauseTrigger(c.Context(), ns, args[0])
			} else {
				v, err = cl.ResumeTrigger(c.Context(), ns, args[0])
			}
			if err != nil {
				return err
			}
			fmt.Printf("trigger %s/%s: %s\n", v.Namespace, v.Name, v.Status.State)
			return nil
		},
	}
	c.Flags().StringVarP(&ns, "namespace", "n", "", "namespace (default: the token's, else default)")
	return c
}
