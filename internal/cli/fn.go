package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newFn(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "fn", Short: "Manage functions: deploy, list, get, delete", Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() }}
	c.AddCommand(newFnDeploy(g), newFnUpdate(g), newFnList(g), newFnGet(g), newFnDelete(g), newFnLogs(g), newFnRevisions(g), newFnRollback(g), newFnTraffic(g))
	return c
}

type deployFlags struct {
	builtin, command, image, file, lb, cpu string
	port, min, max, concurrency, queue     int
	memory                                 int64
	env                                    []string
	secrets                                []string
	wait                                   bool
	waitTimeout                            time.Duration
	timeout, queueTimeout, window, grace   time.Duration
	target, utilization                    float64
	writableRoot, streamRequests, public   bool
	namespace, scalingMode                 string
	placement, keepAlive                   string
	traffic                                string
	// async: block
	asyncAttempts, asyncConcurrency int
	asyncMaxAge, asyncBackoff       time.Duration
	asyncRetryFnErrors              bool
	// deployed from source
	lang, code, handler, contract string
	cl                            *client.Client // uploads --code
}

// newFnUpdate changes only the flags given, keeping the rest of the
// function's current spec.
func newFnUpdate(g *globals) *cobra.Command {
	f := &deployFlags{}
	c := &cobra.Command{
		Use:     "update NAME",
		Short:   "Change some settings of an existing function (a new revision)",
		Example: `  brisk fn update hello --max 50 --queue-timeout 5s`,
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cl := g.client()
			f.cl = cl
			if c.Flags().Changed("traffic") && c.Flags().NFlag() == trafficOnlyFlags(c) {
				return f.setTraffic(c, cl, args[0]) // a split is not a revision
			}
			cur, err := cl.Get(c.Context(), args[0])
			if err != nil {
				return err
			}
			fn, err := f.apply(c, cur.Function)
			if err != nil {
				return err
			}
			fn.UID, fn.Revision, fn.Generation, fn.CreatedAt, fn.UpdatedAt = "", 0, 0, time.Time{}, time.Time{}
			out, err := cl.Update(c.Context(), fn)
			if err != nil {
				return err
			}
			fmt.Printf("function %s updated (revision %d)\n", out.Name, out.RevisionNumber())
			if err := f.setTraffic(c, cl, out.Name); err != nil {
				return err
			}
			return f.waitReady(c, cl, out)
		},
	}
	f.register(c)
	return c
}

func newFnDeploy(g *globals) *cobra.Command {
	f := &deployFlags{}
	c := &cobra.Command{
		Use:   "deploy NAME",
		Short: "Register a function, or update it if it exists",
		Long: `Register a function, or update it (a new revision) if it exists.
Exactly one of --builtin, --command, --image or --code says what runs. A --command is
started with PORT set to the port it must serve HTTP on. --code deploys Python or
Node source: brisk uploads it and runs the handler in a managed runtime.`,
		Example: `  brisk fn deploy hello --builtin trace
  brisk fn deploy myfn --command "/path/to/server --flag" --port 8080 --min 0 --max 20 --concurrency 1
  brisk fn deploy myfn -f spec.json
  brisk fn deploy greet --code ./src --lang python --handler app.handler --wait
  brisk fn deploy web --code handler.js --contract http`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cl := g.client()
			f.cl = cl
			fn, err := f.spec(c, args[0])
			if err != nil {
				return err
			}
			out, err := cl.Create(c.Context(), fn)
			verb := "created"
			var old *spec.Function
			if client.IsConflict(err) {
				if cur, gerr := cl.Get(c.Context(), spec.Qualify(fn.Name, fn.Namespace)); gerr == nil {
					old = cur.Function
				}
				out, err = cl.Update(c.Context(), fn)
				verb = "updated"
			}
			if err != nil {
				return err
			}
			fmt.Printf("function %s %s (revision %d)\n", out.Name, verb, out.RevisionNumber())
			if old != nil {
				// deploy replaces the whole spec (fn update changes only
				// the flags given): say what that replaced.
				if d := specChanges(old, out); d != "" {
					fmt.Printf("changed: %s\n", d)
				} else {
					fmt.Println("nothing changed but the revision: its sandboxes are replaced")
				}
			}
			if err := f.setTraffic(c, cl, out.Name); err != nil {
				return err
			}
			return f.waitReady(c, cl, out)
		},
	}
	c.Flags().StringVarP(&f.file, "file", "f", "", "read the spec from a JSON file (- for stdin); flags override it")
	f.register(c)
	return c
}

func (f *deployFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.builtin, "builtin", "", "built-in function to run: trace")
	fl.StringVar(&f.command, "command", "", "local command to run (process and native runtimes); quotes group words; '$PORT' (quoted, so that your shell leaves it) is the sandbox's port")
	fl.StringVar(&f.image, "image", "", "OCI image to run (containerd runtime)")
	fl.StringVar(&f.code, "code", "", "deploy from source: a directory, a .zip, or one source file, uploaded and run in a managed runtime (process, native and containerd runtimes; docs/languages.md)")
	fl.StringVar(&f.lang, "lang", "", "with --code: python or node (default: guessed from the files)")
	fl.StringVar(&f.handler, "handler", "", "with --code: MODULE.FUNCTION to call, e.g. app.handler (default: lambda_function.lambda_handler or index.handler; with --contract http handler.handle, or for Node handler, the module's export)")
	fl.StringVar(&f.contract, "contract", "", "with --code: lambda (AWS Lambda's handler(event, context), the default) or http (a request in, status/headers/body out, as OpenFaaS's templates)")
	fl.IntVar(&f.port, "port", 0, "port the function serves HTTP on in its sandbox (containerd and native runtimes; default 8080); the process runtime picks a free port per sandbox and passes it as PORT")
	fl.IntVar(&f.min, "min", 0, "minimum sandboxes (0 allows scale to zero)")
	fl.IntVar(&f.max, "max", 0, "maximum sandboxes (0 = unbounded)")
	fl.IntVar(&f.concurrency, "concurrency", 0, "concurrent requests per sandbox (default 1; 0 in a spec file means default)")
	fl.StringVar(&f.cpu, "cpu", "", "CPU per sandbox, e.g. 250m or 0.5 (default 250m)")
	fl.Int64Var(&f.memory, "memory", 0, "memory per sandbox in MiB (default 128)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringSliceVar(&f.secrets, "secret", nil, "a secret of the namespace the sandboxes read at "+spec.SecretsDir+"/NAME (repeatable or comma-separated; brisk secret create)")
	fl.DurationVar(&f.timeout, "timeout", 0, "request timeout (default 5m)")
	fl.IntVar(&f.queue, "queue-depth", 0, "requests a data plane queues while no sandbox is free (default 1000)")
	fl.DurationVar(&f.queueTimeout, "queue-timeout", 0, "how long a request may wait for a sandbox (default 30s)")
	fl.Float64Var(&f.target, "target", 0, "autoscaler target in-flight requests per sandbox (default: --concurrency)")
	fl.Float64Var(&f.utilization, "target-utilization", 0, "fraction of the target to aim for, (0,1] (default 1.0)")
	fl.StringVar(&f.scalingMode, "scaling-mode", "", "async (calls wait for regular sandboxes), sync (Lambda-like: a sandbox per waiting call at once, the peak kept for --keep-alive, default the stable window + grace) or dual (a call finding no free sandbox is served at once by a one-shot emergency sandbox on a worker); default: the control plane's --scaling-mode")
	fl.DurationVar(&f.window, "stable-window", 0, "autoscaler stable window (default 60s)")
	fl.DurationVar(&f.grace, "scale-to-zero-grace", 0, "idle time after the stable window before scaling to zero (default 30s)")
	fl.StringVar(&f.lb, "lb", "", "the data plane's choice among the function's sandboxes: "+strings.Join(spec.LoadBalancers, ", ")+
		"; the papers' locality balancers (sharding, ch-bl, ch-rlu, locality) choose nodes in brisk and set --placement (docs/policies.md)")
	fl.StringVar(&f.placement, "placement", "", "the control plane's choice of node for new sandboxes: "+strings.Join(spec.Placements, ", ")+" (default: the cluster's --placement)")
	fl.StringVar(&f.keepAlive, "keep-alive", "", "how idle sandboxes are kept: POLICY, DURATION or POLICY:DURATION, e.g. gd, 10m, ttl:5m; gd (the cluster default) keeps them DURATION (default 15m) unless their room is needed first, ttl removes them as the autoscaler scales down (Knative; DURATION: its scale-down delay)")
	fl.BoolVar(&f.writableRoot, "writable-root", false, "containerd: give the container a writable root file system (default: read-only, writable /tmp)")
	fl.StringVar(&f.namespace, "namespace", "", "the namespace (tenant) to deploy into (default: the token's, or \"default\")")
	fl.BoolVar(&f.public, "public", false, "anyone who reaches a data plane may call the function (default: calls need a token with the invoke scope)")
	fl.BoolVar(&f.streamRequests, "stream-requests", false, "send request bodies to the function as they arrive (full-duplex calls); by default a body is read before the call takes a sandbox")
	fl.IntVar(&f.asyncAttempts, "async-max-attempts", 0, fmt.Sprintf("attempts of an asynchronous call, the first included, before it is dead (default %d)", spec.DefaultAsyncMaxAttempts))
	fl.DurationVar(&f.asyncMaxAge, "async-max-age", 0, fmt.Sprintf("an asynchronous call older than this is not tried again (default %s)", spec.DefaultAsyncMaxAge))
	fl.DurationVar(&f.asyncBackoff, "async-backoff", 0, fmt.Sprintf("delay before an asynchronous call's second attempt; it doubles up to 5m (default %s)", spec.DefaultAsyncBackoff))
	fl.BoolVar(&f.asyncRetryFnErrors, "async-retry-function-errors", false, "retry asynchronous calls after the function's own 5xx too (by default only after the platform's failures and 429)")
	fl.BoolVar(&f.wait, "wait", false, "wait until a sandbox of the new revision serves (with --min ≥ 1), printing progress; fail at once if its sandboxes cannot start")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 2*time.Minute, "with --wait: give up after this long")
	fl.StringVar(&f.traffic, "traffic", "", "split calls between revisions, e.g. rev-3=90,latest=10 (latest: the current revision, after this command's update); latest=100 ends a split. A split makes no revision (brisk fn traffic)")
	fl.IntVar(&f.asyncConcurrency, "async-concurrency", 0, fmt.Sprintf("asynchronous calls of the function running at once per data plane (default %d)", spec.DefaultAsyncConcurrency))
}

// applyCode sets fn's code from --code (uploaded) and its companions,
// which alone change an existing code function's settings.
func (f *deployFlags) applyCode(c *cobra.Command, fn *spec.Function) error {
	set := c.Flags().Changed
	if !set("code") {
		if (set("lang") || set("handler") || set("contract")) && fn.Code == nil {
			return usageError{errors.New("--lang, --handler and --contract go with --code (the function is not deployed from source)")}
		}
		if fn.Code != nil {
			if set("lang") {
				fn.Code.Language = f.lang
			}
			if set("handler") {
				fn.Code.Handler = f.handler
			}
			if set("contract") {
				fn.Code.Contract = f.contract
			}
		}
		return nil
	}
	data, err := readCode(f.code)
	if err != nil {
		return usageError{fmt.Errorf("--code %s: %w", f.code, err)}
	}
	a, err := codezip.Open(data)
	if err != nil {
		return usageError{fmt.Errorf("--code %s: %w", f.code, err)}
	}
	lang := f.lang
	if lang == "" {
		if lang = guessLang(a.Files); lang == "" {
			return usageError{fmt.Errorf("--code %s: say --lang python or --lang node (the files do not tell)", f.code)}
		}
	}
	code := &spec.Code{Language: lang, Handler: f.handler, Contract: f.contract}
	if code.Contract == "" {
		code.Contract = spec.ContractLambda
	}
	if code.Handler == "" {
		code.Handler = spec.DefaultHandler(lang, code.Contract)
		if fi, err := os.Stat(f.code); err == nil && fi.Mode().IsRegular() && !strings.HasSuffix(f.code, ".zip") {
			// One file: its module, and the contract's usual function name.
			mod := strings.TrimSuffix(filepath.Base(f.code), filepath.Ext(f.code))
			code.Handler = mod
			if _, name, ok := strings.Cut(spec.DefaultHandler(lang, code.Contract), "."); ok {
				code.Handler = mod + "." + name
			}
		}
	}
	if err := a.CheckHandler(code); err != nil {
		return usageError{fmt.Errorf("--code %s: %w (name it with --handler MODULE.FUNCTION)", f.code, err)}
	}
	if f.cl == nil {
		return errors.New("--code: no control plane to upload to")
	}
	up, err := f.cl.UploadCode(c.Context(), data)
	if err != nil {
		return err
	}
	code.Digest = up.Digest
	fn.Code = code
	return nil
}

// readCode is --code's archive: a .zip as it is, a directory or one file
// zipped.
func readCode(p string) ([]byte, error) {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return nil, err
	case fi.IsDir():
		return codezip.Zip(p)
	case strings.HasSuffix(p, ".zip"):
		if fi.Size() > spec.MaxCodeBytes {
			return nil, fmt.Errorf("%d bytes, at most %d", fi.Size(), spec.MaxCodeBytes)
		}
		return os.ReadFile(p)
	}
	return codezip.ZipFile(p)
}

// guessLang is the language of an archive's files: python when it has .py
// files and no .js, node the other way round, "" when it cannot tell.
func guessLang(files []string) string {
	var py, js bool
	for _, f := range files {
		switch filepath.Ext(f) {
		case ".py":
			py = true
		case ".js", ".mjs", ".cjs":
			js = true
		}
	}
	switch {
	case py && !js:
		return spec.LangPython
	case js && !py:
		return spec.LangNode
	}
	return ""
}

func (f *deployFlags) spec(c *cobra.Command, name string) (*spec.Function, error) {
	fn := &spec.Function{}
	if f.file != "" {
		var data []byte
		var err error
		if f.file == "-" {
			data, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
		} else {
			data, err = os.ReadFile(f.file)
		}
		if err != nil {
			return nil, err
		}
		if fn, err = spec.Decode(data); err != nil {
			return nil, fmt.Errorf("%s: %w", f.file, err)
		}
	}
	fn.Name = name
	return f.apply(c, fn)
}

// apply overrides fn with every flag the user set, then validates.
func (f *deployFlags) apply(c *cobra.Command, fn *spec.Function) (*spec.Function, error) {
	set := c.Flags().Changed
	if set("builtin") || set("command") || set("image") || set("code") {
		fn.Builtin, fn.Command, fn.Image, fn.Code = f.builtin, nil, f.image, nil
		if f.command != "" {
			argv, err := splitCommand(f.command)
			if err != nil {
				return nil, usageError{fmt.Errorf("--command: %w", err)}
			}
			fn.Command = argv
		}
	}
	if err := f.applyCode(c, fn); err != nil {
		return nil, err
	}
	if set("port") {
		fn.Port = f.port
	}
	if set("min") {
		fn.Scaling.Min = f.min
	}
	if set("max") {
		fn.Scaling.Max = f.max
	}
	if set("concurrency") {
		fn.Concurrency = f.concurrency
	}
	if set("cpu") {
		r, err := nodeCapacity(f.cpu, 1)
		if err != nil {
			return nil, err
		}
		fn.Resources.MilliCPU = r.MilliCPU
	}
	if set("memory") {
		fn.Resources.MemoryMB = f.memory
	}
	if set("namespace") {
		fn.Namespace = f.namespace
	}
	if set("public") {
		fn.Auth = spec.AuthToken
		if f.public {
			fn.Auth = spec.AuthPublic
		}
	}
	if set("stream-requests") {
		fn.StreamRequests = f.streamRequests
	}
	if set("writable-root") {
		fn.WritableRoot = f.writableRoot
	}
	if set("secret") {
		fn.Secrets = f.secrets
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--env %q: want KEY=VALUE", kv)}
		}
		if fn.Env == nil {
			fn.Env = map[string]string{}
		}
		fn.Env[k] = v
	}
	if set("timeout") {
		fn.Timeout = spec.Duration(f.timeout)
	}
	if set("queue-depth") {
		fn.Queue.Depth = f.queue
	}
	if set("queue-timeout") {
		fn.Queue.Timeout = spec.Duration(f.queueTimeout)
	}
	if set("target") {
		fn.Scaling.Target = f.target
	}
	if set("target-utilization") {
		fn.Scaling.TargetUtilization = f.utilization
	}
	if set("scaling-mode") {
		fn.Scaling.Mode = f.scalingMode
	}
	if set("stable-window") {
		fn.Scaling.StableWindow = spec.Duration(f.window)
	}
	if set("scale-to-zero-grace") {
		fn.Scaling.ScaleToZeroGrace = spec.Duration(f.grace)
	}
	if set("lb") {
		if slices.Contains(spec.Placements, f.lb) && !slices.Contains(spec.LoadBalancers, f.lb) {
			fn.Placement = f.lb // a locality balancer: brisk's placement
		} else {
			fn.LoadBalancing = f.lb
		}
	}
	if set("placement") {
		fn.Placement = f.placement
	}
	if set("keep-alive") {
		if err := parseKeepAlive(f.keepAlive, &fn.Scaling); err != nil {
			return nil, usageError{err}
		}
	}
	if set("async-max-attempts") {
		fn.Async.MaxAttempts = f.asyncAttempts
	}
	if set("async-max-age") {
		fn.Async.MaxAge = spec.Duration(f.asyncMaxAge)
	}
	if set("async-backoff") {
		fn.Async.Backoff = spec.Duration(f.asyncBackoff)
	}
	if set("async-retry-function-errors") {
		fn.Async.RetryFunctionErrors = f.asyncRetryFnErrors
	}
	if set("async-concurrency") {
		fn.Async.Concurrency = f.asyncConcurrency
	}
	// Validate here too, so a bad flag fails with a usage error before any
	// network round trip; the server validates again.
	check := *fn
	check.ApplyDefaults()
	if err := check.Validate(); err != nil {
		return nil, usageError{err}
	}
	return fn, nil
}

// splitCommand splits a command line into words, honouring single and
// double quotes and backslash escapes (no other shell features).
func splitCommand(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	var quote rune
	esc := false
	for _, r := range s {
		switch {
		case esc:
			cur.WriteRune(r)
			esc = false
		case r == '\\' && quote != '\'':
			esc, inWord = true, true
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || esc {
		return nil, fmt.Errorf("unterminated quote or escape in %q", s)
	}
	if inWord {
		out = append(out, cur.String())
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty command")
	}
	return out, nil
}

func newFnList(g *globals) *cobra.Command {
	var asJSON bool
	var opts client.ListOptions
	c := &cobra.Command{
		Use: "list", Short: "List functions with their sandbox counts", Aliases: []string{"ls"}, Args: exactArgs(0),
		Example: `  brisk fn list --namespace team-a --label tier=web
  brisk fn list --status function-failing
  brisk fn list --limit 100                 # then --continue TOKEN for the next page`,
		RunE: func(c *cobra.Command, _ []string) error {
			fns, next, err := g.client().ListPage(c.Context(), opts)
			if err != nil {
				return err
			}
			if next != "" {
				defer fmt.Fprintf(os.Stderr, "more: brisk fn list --limit %d --continue %s\n", opts.Limit, next)
			}
			if asJSON {
				return printJSON(fns)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tNAMESPACE\tKIND\tDESIRED\tREADY\tPENDING\tCONCURRENCY\tREVISION\tCONDITION")
			for _, f := range fns {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", f.Name, f.Namespace, kind(f.Function), f.Status.Desired, f.Status.Ready,
					f.Status.Pending, f.Concurrency, f.RevisionNumber(), condition(f.Status.Condition, f.Status.Message))
			}
			return tw.Flush()
		},
	}
	fl := c.Flags()
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	fl.StringVar(&opts.Namespace, "namespace", "", "only this namespace's functions")
	fl.StringVarP(&opts.Labels, "label", "l", "", "only functions with these labels: key=value or key, comma-separated")
	fl.StringVar(&opts.Status, "status", "", "only functions that are ready, scaled-to-zero, ok (no condition), function-failing, no-capacity or quota-exceeded")
	fl.IntVar(&opts.Limit, "limit", 0, "at most this many (a page; 0: all)")
	fl.StringVar(&opts.Continue, "continue", "", "the next page, from the token a --limit list printed")
	return c
}

func kind(f *spec.Function) string {
	switch {
	case f.Builtin != "":
		return "builtin:" + f.Builtin
	case f.Image != "":
		return "image"
	case f.Code != nil:
		return f.Code.Language
	default:
		return "command"
	}
}

func newFnGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "get NAME", Short: "Show a function's spec and sandboxes (JSON)", Aliases: []string{"describe"}, Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			f, err := g.client().Get(c.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(f)
		},
	}
}

func newFnDelete(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "delete NAME", Short: "Delete a function and terminate its sandboxes", Aliases: []string{"rm"}, Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := g.client().Delete(c.Context(), args[0]); err != nil {
				return err
			}
			fmt.Printf("function %s deleted\n", args[0])
			return nil
		},
	}
}

func newStatus(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use: "status", Short: "Show nodes, functions and their desired/ready sandboxes", Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			st, err := g.client().Status(c.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(st)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "NODE\tRUNTIME\tCONNECTED\tSANDBOXES\tCPU (req/cap)\tMEMORY MiB (req/cap)\tTEMPLATES MiB\n")
			for _, n := range st.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%dm/%dm\t%d/%d\t%d\n", n.ID, n.Runtime, n.Connected, n.Sandboxes,
					n.Requested.MilliCPU, n.Capacity.MilliCPU, n.Requested.MemoryMB, n.Capacity.MemoryMB, n.Templates.MemoryMB)
			}
			fmt.Fprintln(tw)
			fmt.Fprintf(tw, "FUNCTION\tDESIRED\tREADY\tPENDING\tCONDITION\n")
			for _, f := range st.Functions {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", f.Name, f.Desired, f.Ready, f.Pending, condition(f.Condition, f.Message))
			}
			fmt.Fprintln(tw)
			fmt.Fprintf(tw, "DATA PLANE\tADDRESS\tCONNECTED\n")
			for _, d := range st.DataPlanes {
				fmt.Fprintf(tw, "%s\t%s\t%v\n", d.ID, d.Address, d.Connected)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// fullName is the full name of the function a caller names: data planes
// route by full names (NAME.NAMESPACE outside the default namespace), and
// the admin API qualifies a bare one with the token's namespace. A token
// that may not read the function (invoke only) calls it by the name given.
func fullName(ctx context.Context, g *globals, name string) string {
	if strings.IndexByte(name, '.') >= 0 {
		return name
	}
	if v, err := g.client().Get(ctx, name); err == nil && v.Name != "" {
		return v.Name
	}
	return name
}

func newInvoke(g *globals) *cobra.Command {
	var data, dataFile, method string
	var headers []string
	var verbose, async, wait bool
	var callback string
	c := &cobra.Command{
		Use:   "invoke NAME",
		Short: "Call a function and print its response (--async: queue the call and print its id)",
		Long: `Call a function through the data plane and print its response.

Outside the default namespace a function's full name is NAME.NAMESPACE, and
data planes route by it (/function/NAME.NAMESPACE). Given a bare NAME, invoke
asks the admin API for the function's full name first, which qualifies it with
the namespace the token is bound to.`,
		Example: `  brisk invoke hello --data '{"ms": 50}'
  brisk invoke hello -v --data '{"ms": 50}'
  brisk invoke hello --async --data '{"ms": 50}'         # prints the call id
  brisk invoke hello --async --wait --data '{"ms": 50}'  # and waits for its result`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			body := []byte(data)
			if dataFile != "" {
				var err error
				if dataFile == "-" {
					body, err = io.ReadAll(os.Stdin)
				} else {
					body, err = os.ReadFile(dataFile)
				}
				if err != nil {
					return err
				}
			}
			h := http.Header{}
			for _, kv := range headers {
				k, v, ok := strings.Cut(kv, ":")
				if !ok {
					return usageError{fmt.Errorf("--header %q: want Name: value", kv)}
				}
				h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			}
			if len(body) > 0 && h.Get("Content-Type") == "" {
				h.Set("Content-Type", "application/json")
			}
			name := fullName(c.Context(), g, args[0])
			if async {
				return invokeAsync(c.Context(), g, name, method, body, h, callback, wait)
			}
			if wait || callback != "" {
				return usageError{errors.New("--wait and --callback need --async")}
			}
			res, err := g.client().InvokeFunction(c.Context(), name, method, body, h)
			// The data plane's own answer (an *client.Error with the
			// result) is shown as the function's would be, then fails.
			var be *client.Error
			if err != nil && (res == nil || !errors.As(err, &be)) {
				return err
			}
			if verbose {
				fmt.Fprintf(os.Stderr, "status: %d\ncall id: %s\nsandbox: %s\ntiming: %s\ntotal: %s\n", res.Status,
					res.Header.Get("X-Call-Id"), res.Header.Get("X-Brisk-Sandbox"), res.Header.Get("X-Brisk-Timing"),
					res.Duration.Round(time.Microsecond))
				switch {
				case res.Header.Get("X-Brisk-Error") != "":
					fmt.Fprintf(os.Stderr, "brisk error: %s (the platform answered, not the function)\n", res.Header.Get("X-Brisk-Error"))
				case res.Header.Get("X-Brisk-Sandbox") == "":
				case strings.Contains(res.Header.Get("X-Brisk-Timing"), "cold=true"):
					fmt.Fprintln(os.Stderr, "start: cold (waited for a new sandbox)")
				default:
					fmt.Fprintln(os.Stderr, "start: warm")
				}
			}
			os.Stdout.Write(res.Body)
			if len(res.Body) > 0 && res.Body[len(res.Body)-1] != '\n' {
				fmt.Println()
			}
			if why := res.Header.Get("X-Brisk-Error"); why != "" {
				return fmt.Errorf("brisk answered HTTP %d: %s", res.Status, why)
			}
			if res.Status/100 != 2 {
				return fmt.Errorf("function %s answered HTTP %d", args[0], res.Status)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&data, "data", "d", "", "request body")
	c.Flags().StringVar(&dataFile, "data-file", "", "read the request body from a file (- for stdin)")
	c.Flags().StringVarP(&method, "method", "X", http.MethodPost, "HTTP method")
	c.Flags().StringArrayVarP(&headers, "header", "H", nil, "request header 'Name: value' (repeatable)")
	c.Flags().BoolVarP(&verbose, "verbose", "v", false, "print status, timing and cold/warm to stderr")
	c.Flags().BoolVar(&async, "async", false, "queue the call (202) and print its id; brisk calls get ID shows its result")
	c.Flags().BoolVar(&wait, "wait", false, "with --async: wait for the call to finish and print its result")
	c.Flags().StringVar(&callback, "callback", "", "with --async: URL to POST the result to (X-Callback-Url)")
	return c
}

// invokeAsync submits a call and prints its id, or with wait its result.
func invokeAsync(ctx context.Context, g *globals, name, method string, body []byte, h http.Header, callback string, wait bool) error {
	cl := g.client()
	id, err := cl.InvokeAsync(ctx, name, method, body, h, callback)
	if err != nil {
		return err
	}
	if !wait {
		fmt.Println(id)
		return nil
	}
	fmt.Fprintf(os.Stderr, "call id: %s\n", id)
	r, err := cl.WaitCall(ctx, id)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "status: %s after %d attempt(s)\n", r.Status, r.Attempts)
	if r.Result != nil {
		os.Stdout.Write(r.Result.Body)
		if len(r.Result.Body) > 0 && r.Result.Body[len(r.Result.Body)-1] != '\n' {
			fmt.Println()
		}
	}
	if r.Status != api.CallSucceeded {
		return fmt.Errorf("call %s %s: %s", id, r.Status, r.Error)
	}
	return nil
}

func newFnLogs(g *globals) *cobra.Command {
	var o client.LogOptions
	var asJSON bool
	c := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print the output of a function's sandboxes (every runtime but emulated)",
		Long: `Print what a function's sandboxes wrote to stdout and stderr, gathered by
the control plane from every worker (each keeps the logs of the sandboxes it
ran, rotated past 10 MiB per sandbox). Lines are prefixed with their
sandbox; --json prints each as a JSON object (function, sandbox, node,
time, text).`,
		Example: "  brisk fn logs hello --tail 20\n  brisk fn logs hello -f\n  brisk fn logs hello --since 10m --sandbox SANDBOX",
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if o.Tail < 0 {
				return usageError{fmt.Errorf("--tail %d: must not be negative", o.Tail)}
			}
			enc := json.NewEncoder(os.Stdout)
			return g.client().Logs(c.Context(), args[0], o, func(l api.LogLine) error {
				if asJSON {
					return enc.Encode(l)
				}
				_, err := fmt.Printf("[%s] %s\n", l.Sandbox, l.Text)
				return err
			})
		},
	}
	c.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep printing new lines until interrupted")
	c.Flags().IntVar(&o.Tail, "tail", 0, "the function's last lines, of all its sandboxes (0: all that is kept)")
	c.Flags().StringVar(&o.Since, "since", "", "only logs written since: a duration (10m) or an RFC 3339 time")
	c.Flags().StringVar(&o.Sandbox, "sandbox", "", "one sandbox's logs only")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	return c
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newBackup(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "backup FILE",
		Short: "Save a consistent copy of the control plane's registry while it runs",
		Long: `Save a consistent copy of the control plane's registry (functions, workers,
data planes) to FILE while the control plane keeps serving. FILE is a
registry.db: to restore, put it as registry.db in an empty --data-dir and
start the control plane there. Sandboxes are not in it: a control plane
re-reads them from its workers. A replicated control plane (brisk
controlplane --peers) refuses; back up a stopped replica's data dir instead.`,
		Example: `  brisk backup registry-$(date +%F).db`,
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			path := args[0]
			// Written beside FILE and renamed: FILE is whole or untouched.
			f, err := os.CreateTemp(filepath.Dir(path), ".brisk-backup-*")
			if err != nil {
				return err
			}
			defer os.Remove(f.Name())
			n, err := g.client().Backup(c.Context(), f)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Rename(f.Name(), path); err != nil {
				return err
			}
			fmt.Printf("registry saved to %s (%d bytes)\n", path, n)
			return nil
		},
	}
}

// condition renders a function's condition for a table: "-" when nothing
// is wrong, else the reason and its message.
func condition(reason, msg string) string {
	if reason == "" {
		return "-"
	}
	return reason + ": " + msg
}

// keepAliveFlag reads a --keep-alive given to replay or sim: the policy and
// duration it names ("" and 0 for what it leaves out, or for no flag).
func keepAliveFlag(v string) (string, time.Duration, error) {
	var s spec.Scaling
	if v != "" {
		if err := parseKeepAlive(v, &s); err != nil {
			return "", 0, usageError{err}
		}
	}
	return s.KeepAlivePolicy, time.Duration(s.KeepAlive), nil
}

// parseKeepAlive reads --keep-alive: POLICY, DURATION or POLICY:DURATION.
func parseKeepAlive(v string, s *spec.Scaling) error {
	policy, dur, hasDur := strings.Cut(v, ":")
	if !hasDur && !slices.Contains(spec.KeepAlivePolicies, policy) {
		policy, dur, hasDur = "", v, true
	}
	if policy != "" && !slices.Contains(spec.KeepAlivePolicies, policy) {
		return fmt.Errorf("--keep-alive %q: policy %q is not one of %v", v, policy, spec.KeepAlivePolicies)
	}
	if hasDur {
		d, err := time.ParseDuration(dur)
		if err != nil || d < 0 || d > time.Hour || d%time.Second != 0 {
			return fmt.Errorf("--keep-alive %q: want POLICY, DURATION or POLICY:DURATION (gd, 10m, ttl:5m); durations in whole seconds up to 1h", v)
		}
		s.KeepAlive = spec.Duration(d)
	}
	if policy != "" {
		s.KeepAlivePolicy = policy
	}
	return nil
}

// waitReady follows a deployed revision until one of its sandboxes is
// ready (--wait), printing each change of its sandboxes' states. A
// condition that keeps sandboxes from starting ends the wait with its cause.
func (f *deployFlags) waitReady(c *cobra.Command, cl *client.Client, out *spec.Function) error {
	if !f.wait {
		return nil
	}
	if out.Scaling.Min == 0 {
		fmt.Printf("scaling.min is 0: no sandbox starts before the first call (deploy with --min 1 to wait for one)\n")
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Context(), f.waitTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		v, err := cl.Get(ctx, out.Name)
		if err != nil {
			return err
		}
		if v.Revision != out.Revision {
			return fmt.Errorf("function %s changed again while waiting (revision %d)", out.Name, v.RevisionNumber())
		}
		states := map[string]int{}
		for _, sb := range v.Status.Sandboxes {
			if sb.Revision == out.Revision {
				states[sb.State]++
			}
		}
		line := fmt.Sprintf("sandboxes of revision %d: %d starting, %d ready (desired %d)", out.RevisionNumber(), states["assumed"]+states["pending"], states["ready"], v.Status.Desired)
		if line != last {
			fmt.Println(line)
			last = line
		}
		switch {
		case states["ready"] > 0:
			fmt.Printf("function %s is serving\n", out.Name)
			return nil
		case v.Status.Condition == reconciler.CondFunctionFailing && v.Status.Failures >= reconciler.FailFastAfter:
			return fmt.Errorf("function %s cannot start: %s", out.Name, v.Status.Message)
		case v.Status.Condition != "" && v.Status.Condition != reconciler.CondFunctionFailing:
			fmt.Printf("waiting: %s: %s\n", v.Status.Condition, v.Status.Message)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("function %s: no sandbox ready after %s (brisk fn get %s)", out.Name, f.waitTimeout, out.Name)
		case <-tick.C:
		}
	}
}

// specChanges lists the fields of a spec that differ between a and b, with
// the keys of maps (env, labels, ...) added, removed or changed; values are
// not shown (they may be secrets).
func specChanges(a, b *spec.Function) string {
	fields := func(f *spec.Function) map[string]json.RawMessage {
		c := *f
		c.UID, c.Revision, c.Generation, c.CreatedAt, c.UpdatedAt = "", 0, 0, time.Time{}, time.Time{}
		raw, _ := json.Marshal(&c)
		m := map[string]json.RawMessage{}
		_ = json.Unmarshal(raw, &m)
		return m
	}
	fa, fb := fields(a), fields(b)
	keys := map[string]bool{}
	for k := range fa {
		keys[k] = true
	}
	for k := range fb {
		keys[k] = true
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		va, vb := fa[k], fb[k]
		if string(va) == string(vb) {
			continue
		}
		ma, oka := jsonObject(va)
		mb, okb := jsonObject(vb)
		if oka && okb {
			var parts []string
			for _, sk := range slices.Sorted(maps.Keys(ma)) {
				if _, ok := mb[sk]; !ok {
					parts = append(parts, "-"+sk)
				} else if string(ma[sk]) != string(mb[sk]) {
					parts = append(parts, "~"+sk)
				}
			}
			for _, sk := range slices.Sorted(maps.Keys(mb)) {
				if _, ok := ma[sk]; !ok {
					parts = append(parts, "+"+sk)
				}
			}
			out = append(out, k+" ("+strings.Join(parts, " ")+")")
			continue
		}
		out = append(out, k)
	}
	return strings.Join(out, ", ")
}

// jsonObject decodes an object field; an absent one (nil) is empty.
func jsonObject(v json.RawMessage) (map[string]json.RawMessage, bool) {
	m := map[string]json.RawMessage{}
	if len(v) == 0 {
		return m, true
	}
	if v[0] != '{' || json.Unmarshal(v, &m) != nil {
		return nil, false
	}
	return m, true
}

// trafficOnlyFlags counts the flags given that leave the spec alone: with
// only these and --traffic, fn update makes no revision.
func trafficOnlyFlags(c *cobra.Command) int {
	n := 0
	for _, name := range []string{"traffic", "wait", "wait-timeout"} {
		if c.Flags().Changed(name) {
			n++
		}
	}
	// Global flags (--server, --token, ...) are the root's persistent flags.
	c.InheritedFlags().Visit(func(*pflag.Flag) { n++ })
	return n
}

// setTraffic applies --traffic, if given.
func (f *deployFlags) setTraffic(c *cobra.Command, cl *client.Client, name string) error {
	if !c.Flags().Changed("traffic") {
		return nil
	}
	return setTraffic(c, cl, name, f.traffic)
}

// setTraffic sets function name's split as the CLI writes it and prints it.
func setTraffic(c *cobra.Command, cl *client.Client, name, split string) error {
	ts, err := spec.ParseTraffic(split)
	if err != nil {
		return usageError{err}
	}
	out, err := cl.SetTraffic(c.Context(), name, ts)
	if err != nil {
		return err
	}
	printTraffic(out)
	return nil
}

func printTraffic(f *spec.Function) {
	if len(f.Traffic) == 0 {
		fmt.Printf("function %s: every call to the current revision (%d)\n", f.Name, f.RevisionNumber())
		return
	}
	fmt.Printf("function %s: traffic %s (latest = revision %d)\n", f.Name, spec.FormatTraffic(f.Traffic), f.RevisionNumber())
}

func newFnTraffic(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "traffic NAME [SPLIT]",
		Short: "Show or set how a function's calls are split between its revisions",
		Long: `A split sends shares of a function's calls to revisions kept in its history
(brisk fn revisions NAME), e.g. a canary: rev-3=90,latest=10. "latest" is the
current revision, whatever it is when a call comes; rev-N stays on revision N
after later updates. Each pinned earlier revision runs sandboxes of its own and
scales on its own share; latest=100 ends the split. Setting a split makes no
revision. Each data plane sends every 100 calls exactly by the percents.`,
		Example: `  brisk fn traffic hello
  brisk fn traffic hello rev-3=90,latest=10
  brisk fn traffic hello latest=100`,
		Args: rangeArgs(1, 2),
		RunE: func(c *cobra.Command, args []string) error {
			cl := g.client()
			if len(args) == 1 {
				v, err := cl.Get(c.Context(), args[0])
				if err != nil {
					return err
				}
				printTraffic(v.Function)
				if len(v.Status.Traffic) > 0 {
					tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "TARGET\tPERCENT\tREVISION\tSERVED BY\tDESIRED\tREADY")
					for _, t := range v.Status.Traffic {
						by := t.Function
						if t.Missing {
							by += " (revision no longer kept)"
						}
						served := t.ServedRevision
						if t.ServedGeneration > 0 {
							served = t.ServedGeneration
						}
						fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\n", t.Name(), t.Percent, served, by, t.Desired, t.Ready)
					}
					return tw.Flush()
				}
				return nil
			}
			return setTraffic(c, cl, args[0], args[1])
		},
	}
}

func newFnRevisions(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "revisions NAME",
		Short: "List a function's revisions, newest first, with what each changed",
		Long: `Every update makes a new revision; the control plane keeps the last 20
replaced ones. CHANGES are the fields (and map keys, never values) each
revision changed from the one before it.`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			revs, err := g.client().Revisions(c.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(revs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REVISION\tUPDATED\tKIND\tCHANGES")
			for i, f := range revs {
				changes := "(first kept)"
				if i+1 < len(revs) {
					changes = specChanges(revs[i+1], f)
				}
				cur := ""
				if i == 0 {
					cur = " (current)"
				}
				fmt.Fprintf(tw, "%d%s\t%s\t%s\t%s\n", f.RevisionNumber(), cur, f.UpdatedAt.Format("2006-01-02 15:04:05"), kind(f), changes)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newFnRollback(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rollback NAME [REVISION]",
		Short: "Make an earlier revision's spec the function's newest revision (default: the one before the current)",
		Args:  rangeArgs(1, 2),
		RunE: func(c *cobra.Command, args []string) error {
			var rev uint64
			if len(args) == 2 {
				v, err := strconv.ParseUint(args[1], 10, 64)
				if err != nil {
					return usageError{fmt.Errorf("revision %q: want a number from brisk fn revisions %s", args[1], args[0])}
				}
				rev = v
			}
			cl := g.client()
			before, err := cl.Get(c.Context(), args[0])
			if err != nil {
				return err
			}
			out, err := cl.Rollback(c.Context(), args[0], rev)
			if err != nil {
				return err
			}
			fmt.Printf("function %s rolled back: revision %d has the spec of an earlier one\n", out.Name, out.RevisionNumber())
			if d := specChanges(before.Function, out); d != "" {
				fmt.Printf("changed: %s\n", d)
			}
			return nil
		},
	}
}
