// Package cli wires brisk's cobra commands: flags become component configs,
// components run under one errgroup; no logic lives here.
package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/pkg/client"
)

// exitUsage is the exit code for invalid command-line usage.
const exitUsage = 2

type usageError struct{ error }

// Main runs the brisk command line and returns the process exit code.
func Main(args []string) int {
	maybeServePprof()
	tuneRuntime()
	root := newRoot()
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) || isFlagError(err) {
		fmt.Fprintf(os.Stderr, "brisk: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(os.Stderr, "brisk: %v\n", err)
	return 1
}

func isFlagError(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand flag") || strings.Contains(s, "flag needs an argument") ||
		strings.HasPrefix(s, "invalid argument") || strings.Contains(s, "accepts ") || strings.HasPrefix(s, "required flag")
}

type globals struct {
	admin, invoke    string
	caCert           string
	token, tokenFile string
	logLevel         string
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "brisk",
		Short: "brisk: a fast, dependable Function-as-a-Service cluster manager",
		Long: `brisk runs functions on demand: it creates sandboxes from zero, routes and
load-balances invocations, scales with traffic and keeps serving through failures.

Start a local cluster with 'brisk up', deploy a function with 'brisk fn deploy',
and call it with 'brisk invoke' or plain HTTP on the data plane.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w\nUsage: %s", err, c.UseLine())}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&g.admin, "admin-url", envOr(client.EnvAdmin, client.DefaultAdmin), "control plane admin API address, or an HA control plane's replicas comma-separated (requests move to another replica when one cannot serve them) (env BRISK_ADMIN)")
	pf.StringVar(&g.invoke, "invoke-url", envOr(client.EnvInvoke, client.DefaultInvoke), "data plane invocation address (env BRISK_INVOKE)")
	pf.StringVar(&g.token, "token", os.Getenv(client.EnvToken), "API token for the admin API and invocations (env BRISK_TOKEN; default: the one in --token-file)")
	pf.StringVar(&g.tokenFile, "token-file", client.DefaultTokenFile(),
		"file holding the API token when --token is not given: brisk up writes the first admin token to <data-dir>/admin.token (env BRISK_TOKEN_FILE)")
	pf.StringVar(&g.caCert, "ca-cert", os.Getenv(client.EnvCACert), "PEM CA certificate to trust, besides the system's roots, for https:// admin and invoke URLs, e.g. the cluster CA <data-dir>/ca.crt of a cluster run with --tls-generate (env BRISK_CA_CERT)")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newUp(g), newControlPlane(g), newDataPlane(g), newGateway(g), newWorker(g), newFn(g), newInvoke(g), newStatus(g), newBackup(g), newApply(g), newGet(g), newCalls(g), newNATS(g), newTraceFn(), newToken(g), newNamespace(g), newSecret(g), newTrigger(g), newImage(g), newNetBench(), newBench(g), newReplay(g), newSim(), newCA(g), newUI(g), newK8s(g))
	return root
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func (g *globals) client() *client.Client {
	c := client.New(g.admin, g.invoke)
	c.Token = g.apiToken()
	if g.caCert != "" {
		if err := c.TrustCAFile(g.caCert); err != nil {
			// Every call then fails with it (--ca-cert is a usage error
			// only for commands that talk to the cluster).
			c.HTTP = &http.Client{Transport: errTransport{fmt.Errorf("--ca-cert: %w", err)}}
		}
	}
	return c
}

// apiToken is --token, or the token in --token-file ("" when neither
// gives one: the control plane then says a token is needed).
// errTransport fails every request with err.
type errTransport struct{ err error }

func (t errTransport) RoundTrip(*http.Request) (*http.Response, error) { return nil, t.err }

func (g *globals) apiToken() string {
	if g.token != "" {
		return g.token
	}
	b, err := os.ReadFile(g.tokenFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (g *globals) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)}
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}

// exactArgs is cobra.ExactArgs with a usage line in the error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %d argument(s), got %d\nUsage: %s", c.CommandPath(), n, len(args), c.UseLine())}
		}
		return nil
	}
}

// rangeArgs is cobra.RangeArgs with a usage line in the error.
func rangeArgs(lo, hi int) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageError{fmt.Errorf("%s takes %d to %d arguments, got %d\nUsage: %s", c.CommandPath(), lo, hi, len(args), c.UseLine())}
		}
		return nil
	}
}
