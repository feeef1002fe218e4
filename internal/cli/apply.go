package cli

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/compat/knative"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newApply(g *globals) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or update functions from Knative Service YAML (serving.knative.dev/v1), and cron triggers from PingSources",
		Long: `Create or update a function for each Knative Service in FILE (several
documents separated by ---; - reads stdin), as kubectl apply would give
Knative: the container's image, env, port and resources,
containerConcurrency, timeoutSeconds, and the autoscaling.knative.dev
annotations min-scale, max-scale, target, target-utilization-percentage,
window and metric (concurrency). brisk's own annotations: brisk.dev/builtin
(run a built-in function such as trace instead of the image) and
brisk.dev/public ("true": calls need no token). An existing function's spec
is replaced. A PingSource (sources.knative.dev/v1) whose sink is a Service
becomes a cron trigger of that function (schedule, timezone, data or
dataBase64, contentType; its calls are CloudEvents as PingSource sends
them); an existing one is updated. See docs/compatibility.md and
docs/triggers.md.`,
		Example: "  brisk apply -f service.yaml\n  brisk get hello -o yaml",
		Args:    exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if file == "" {
				return usageError{errors.New("-f FILE is required")}
			}
			var data []byte
			var err error
			if file == "-" {
				data, err = io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
			} else {
				data, err = os.ReadFile(file)
			}
			if err != nil {
				return usageError{err}
			}
			objs, err := knative.ParseAll(data)
			if err != nil {
				return usageError{fmt.Errorf("%s: %w", file, err)}
			}
			cl := g.client()
			for _, f := range objs.Functions {
				verb := "configured"
				_, err := cl.Update(c.Context(), f)
				if client.IsNotFound(err) {
					verb = "created"
					_, err = cl.Create(c.Context(), f)
				}
				if err != nil {
					return fmt.Errorf("service %s: %w", f.Name, err)
				}
				fmt.Printf("service.serving.knative.dev/%s %s\n", f.Name, verb)
			}
			for _, t := range objs.Triggers {
				verb := "created"
				_, err := cl.CreateTrigger(c.Context(), *t)
				var ce *client.Error
				if errors.As(err, &ce) && ce.Status == http.StatusConflict {
					verb = "configured"
					_, err = cl.UpdateTrigger(c.Context(), *t)
				}
				if err != nil {
					return fmt.Errorf("pingsource %s: %w", t.Name, err)
				}
				fmt.Printf("pingsource.sources.knative.dev/%s %s\n", t.Name, verb)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "YAML or JSON file of Knative Services (- for stdin)")
	return c
}

func newGet(g *globals) *cobra.Command {
	var output, domain string
	c := &cobra.Command{
		Use:   "get [NAME] -o yaml",
		Short: "Show functions as Knative Services (YAML or JSON)",
		Long: `Show a function (or every function) as a Knative Service, with status.url
(http://NAME.NAMESPACE.DOMAIN: the data plane routes by the Host's first
label) and a Ready condition. brisk fn get shows brisk's own spec.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if output != "yaml" && output != "json" {
				return usageError{fmt.Errorf("-o %q: want yaml or json", output)}
			}
			cl := g.client()
			var views []api.FunctionView
			if len(args) == 1 {
				v, err := cl.Get(c.Context(), args[0])
				if err != nil {
					return err
				}
				views = append(views, *v)
			} else {
				vs, err := cl.List(c.Context())
				if err != nil {
					return err
				}
				views = vs
			}
			var svcs []*knative.Service
			for _, v := range views {
				ns := v.Namespace
				if ns == "" {
					ns = "default"
				}
				svcs = append(svcs, knative.FromSpec(v.Function, "http://"+spec.ShortName(v.Name)+"."+ns+"."+domain, v.Status.Condition == "", v.Status.Message))
			}
			if output == "json" {
				if len(svcs) == 1 {
					return printJSON(svcs[0])
				}
				return printJSON(map[string]any{"apiVersion": "v1", "kind": "List", "items": svcs})
			}
			y, err := knative.YAML(svcs...)
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(y)
			return err
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "yaml", "yaml or json")
	c.Flags().StringVar(&domain, "domain", "brisk.local", "domain of status.url")
	return c
}
