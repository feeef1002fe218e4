package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/pki"
)

// asyncFlags configure a component's asynchronous-call queue: an embedded
// NATS server (brisk up) or an existing NATS cluster (--nats).
type asyncFlags struct {
	url, tokenFile string
	replicas       int
	syncAlways     bool
	noAsync        bool
	listen         string
	maxQueued      int64
	nsShare        float64
	nsResultBytes  int64
	resultTTL      time.Duration
	ackWait        time.Duration
	callbackAllow  []string
}

func (f *asyncFlags) register(c *cobra.Command, embedded bool) {
	def := "the NATS server with JetStream holding asynchronous calls (nats://host:port,...); empty: asynchronous calls are off"
	if embedded {
		def = "an existing NATS server with JetStream for asynchronous calls (nats://host:port,...); empty: an embedded one storing under --data-dir/nats"
		c.Flags().BoolVar(&f.noAsync, "no-async", false, "no asynchronous calls (and no embedded NATS server)")
		c.Flags().StringVar(&f.listen, "nats-listen", "", "also serve the embedded NATS server to other processes on this host:port, with the token in <data-dir>/nats.token (made at the first start): clients publish there the messages NATS triggers take (docs/triggers.md); off by default")
		c.Flags().BoolVar(&f.syncAlways, "nats-sync-always", false, "the embedded JetStream fsyncs every write before a call is accepted: accepted calls survive a power loss, at the price of accept throughput (docs/operations.md)")
	}
	c.Flags().StringVar(&f.url, "nats", "", def)
	c.Flags().StringVar(&f.tokenFile, "nats-token-file", "", "file with the token the NATS server wants (brisk nats --token-file)")
	c.Flags().IntVar(&f.replicas, "nats-replicas", 1, "JetStream replicas of brisk's streams (3 on a NATS cluster)")
	c.Flags().Int64Var(&f.maxQueued, "async-max-queued", async.DefaultMaxQueued, "asynchronous calls waiting at once; past it, submits get 503")
	c.Flags().Float64Var(&f.nsShare, "async-namespace-share", async.DefaultNamespaceShare, "the part of --async-max-queued (and of the queue's bytes) one namespace's waiting calls may hold; past it, its submits get 503 and other namespaces' still go in (1: no share)")
	c.Flags().Int64Var(&f.nsResultBytes, "async-namespace-result-bytes", async.DefaultNamespaceResults, "result bodies above 4 KiB one namespace's asynchronous calls keep at once; past it the oldest are dropped (their records say body_dropped)")
	c.Flags().DurationVar(&f.resultTTL, "async-result-ttl", async.DefaultResultTTL, "how long an asynchronous call's status and result are kept")
	c.Flags().DurationVar(&f.ackWait, "async-ack-wait", async.DefaultAckWait, "how long a call delivered to a data plane that died waits before another data plane takes it")
	c.Flags().StringSliceVar(&f.callbackAllow, "async-callback-allow", nil, "address ranges (CIDR) X-Callback-Url may reach besides public ones; loopback, private, link-local and the like are refused unless listed, e.g. 10.0.0.0/8")
}

// open returns the queue (nil when asynchronous calls are off) and a func
// that closes it and any embedded server.
func (f *asyncFlags) open(ctx context.Context, dataDir string, log *slog.Logger) (*async.Queue, func(), error) {
	nothing := func() {}
	if f.noAsync || (f.url == "" && dataDir == "") {
		return nil, nothing, nil
	}
	if f.replicas < 1 || f.replicas > 5 {
		return nil, nothing, usageError{fmt.Errorf("--nats-replicas %d: want 1 to 5", f.replicas)}
	}
	if f.maxQueued < 1 {
		return nil, nothing, usageError{fmt.Errorf("--async-max-queued %d: must be positive", f.maxQueued)}
	}
	if !(f.nsShare > 0 && f.nsShare <= 1) {
		return nil, nothing, usageError{fmt.Errorf("--async-namespace-share %v: want a fraction in (0, 1]", f.nsShare)}
	}
	if f.nsResultBytes < 1<<20 {
		return nil, nothing, usageError{fmt.Errorf("--async-namespace-result-bytes %d: at least 1 MiB (one call's largest result)", f.nsResultBytes)}
	}
	allow, err := parseCIDRs("--async-callback-allow", f.callbackAllow)
	if err != nil {
		return nil, nothing, err
	}
	var nc *nats.Conn
	var srv *async.Server
	if f.listen != "" && f.url != "" {
		return nil, nothing, usageError{errors.New("--nats-listen serves the embedded NATS server, which --nats replaces: give one")}
	}
	if f.url == "" {
		scfg := async.ServerConfig{Dir: filepath.Join(dataDir, "nats"), SyncAlways: f.syncAlways, Listen: f.listen}
		if f.listen != "" {
			if scfg.Token, err = natsToken(filepath.Join(dataDir, "nats.token")); err != nil {
				return nil, nothing, err
			}
		}
		srv, err = async.StartServer(scfg)
		if err == nil && f.listen != "" {
			fmt.Fprintf(os.Stderr, "NATS: %s (token in %s)\n", srv.ClientURL(), filepath.Join(dataDir, "nats.token"))
		}
		if err != nil {
			return nil, nothing, err
		}
		nc, err = srv.Connect("brisk")
	} else {
		opts := []nats.Option{nats.Name("brisk"), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
		if f.tokenFile != "" {
			tok, rerr := os.ReadFile(f.tokenFile)
			if rerr != nil {
				return nil, nothing, usageError{fmt.Errorf("--nats-token-file: %w", rerr)}
			}
			opts = append(opts, nats.Token(strings.TrimSpace(string(tok))))
		}
		nc, err = nats.Connect(f.url, opts...)
	}
	if err != nil {
		if srv != nil {
			srv.Shutdown()
		}
		return nil, nothing, fmt.Errorf("nats %s: %w", f.url, err)
	}
	closeAll := func() {
		nc.Close()
		if srv != nil {
			srv.Shutdown()
		}
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if f.ackWait < time.Second {
		closeAll()
		return nil, nothing, usageError{fmt.Errorf("--async-ack-wait %s: at least 1s", f.ackWait)}
	}
	cfg := async.Config{Replicas: f.replicas, MaxQueued: f.maxQueued, NamespaceShare: f.nsShare, NamespaceResultBytes: f.nsResultBytes, ResultTTL: f.resultTTL, AckWait: f.ackWait, CallbackAllow: allow, Logger: log}
	q, err := async.Open(octx, nc, cfg)
	if err != nil {
		closeAll()
		return nil, nothing, err
	}
	return q, closeAll, nil
}

// natsToken reads the embedded NATS server's token from path, making it
// (256 random bits, mode 0600; its directory too) at the first start.
func natsToken(path string) (string, error) {
	if tok, err := pki.ReadSecretFile(path); err == nil {
		return tok, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("NATS token: %w", err)
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	// The first start of brisk up comes here before anything made the
	// data dir.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("NATS token: %w", err)
	}
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("NATS token: %w", err)
	}
	return tok, nil
}

// parseCIDRs reads a flag's address ranges.
func parseCIDRs(flag string, ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, usageError{fmt.Errorf("%s %q: want a CIDR range such as 127.0.0.0/8", flag, s)}
		}
		out = append(out, p)
	}
	return out, nil
}

func newNATS(g *globals) *cobra.Command {
	var listen, dir, tokenFile string
	var syncAlways bool
	c := &cobra.Command{
		Use:   "nats --listen HOST:PORT --token-file FILE",
		Short: "Run the NATS server with JetStream that holds asynchronous calls (for data planes in other processes)",
		Long: `Run brisk's embedded NATS server with JetStream on its own, for clusters whose
data planes run as separate processes: point each at it with
--nats nats://HOST:PORT --nats-token-file FILE. Clients must present the
token in --token-file. brisk up embeds the same server in-process (no
listener). For replicated storage run a NATS cluster instead and give the
data planes --nats-replicas 3 (docs/operations.md).`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if tokenFile == "" {
				return usageError{errors.New("--token-file is required: the NATS listener authenticates its clients")}
			}
			tok, err := os.ReadFile(tokenFile)
			if err != nil {
				return usageError{fmt.Errorf("--token-file: %w", err)}
			}
			if dir == "" {
				dir = filepath.Join(defaultDataDir(), "nats")
			}
			srv, err := async.StartServer(async.ServerConfig{Dir: dir, Listen: listen, Token: strings.TrimSpace(string(tok)), SyncAlways: syncAlways})
			if err != nil {
				return usageOr(err)
			}
			fmt.Fprintf(os.Stderr, "nats serving on %s, JetStream in %s\n", srv.ClientURL(), dir)
			<-c.Context().Done()
			srv.Shutdown()
			return nil
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:4222", "client listen address")
	c.Flags().StringVar(&dir, "data-dir", "", "JetStream storage directory (default <data dir>/nats)")
	c.Flags().StringVar(&tokenFile, "token-file", "", "file holding the token clients must present")
	c.Flags().BoolVar(&syncAlways, "sync-always", false, "fsync every write before acknowledging it (survives a power loss; slower)")
	return c
}

func newCalls(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "calls", Short: "Inspect and manage asynchronous calls: list, get, retry, purge", Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() }}
	var fn, status string
	var limit int
	list := &cobra.Command{Use: "list", Short: "List asynchronous calls, newest first", Aliases: []string{"ls"}, Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			recs, err := g.client().Calls(c.Context(), fn, status, limit)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tFUNCTION\tSTATUS\tATTEMPTS\tSUBMITTED\tRESULT\tERROR")
			for _, r := range recs {
				res := "-"
				if r.Result != nil && r.Result.Status != 0 {
					res = fmt.Sprint(r.Result.Status)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Function, r.Status, r.Attempts, r.SubmittedAt.Format(time.RFC3339), res, r.Error)
			}
			return tw.Flush()
		}}
	list.Flags().StringVar(&fn, "function", "", "only this function's calls")
	list.Flags().StringVar(&status, "status", "", "only calls in this status: queued, running, succeeded, failed, dead")
	list.Flags().IntVar(&limit, "limit", 100, "at most this many")
	get := &cobra.Command{Use: "get ID", Short: "Show a call's status, attempts, timings and result (JSON)", Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			r, err := g.client().Call(c.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(r)
		}}
	retry := &cobra.Command{Use: "retry ID", Short: "Run a failed or dead call again (it leaves the dead-letter stream)", Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			r, err := g.client().RetryCall(c.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Printf("call %s queued again\n", r.ID)
			return nil
		}}
	var dead bool
	purge := &cobra.Command{Use: "purge [FUNCTION]", Short: "Drop queued calls (or, with --dead, dead letters) of a function, or of all", Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			n, err := g.client().PurgeCalls(c.Context(), name, dead)
			if err != nil {
				return err
			}
			fmt.Printf("purged %d\n", n)
			return nil
		}}
	purge.Flags().BoolVar(&dead, "dead", false, "purge the dead-letter stream instead of the queue")
	c.AddCommand(list, get, retry, purge)
	return c
}
