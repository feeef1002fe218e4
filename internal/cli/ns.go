package cli

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newNamespace(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:     "ns",
		Aliases: []string{"namespace"},
		Short:   "Manage namespaces (tenants) and their quotas",
		Long: `A namespace is a tenant: functions are deployed into one (--namespace,
default "default"), a token bound to one (brisk token create --namespace)
sees and touches only its functions, and its quota bounds its functions,
its sandboxes and what they request. Quota fields of 0 are unlimited.

Its egress policy narrows where its sandboxes may connect beyond the host
(native and containerd runtimes): --egress-deny destinations are refused;
with --egress-allow, only those are reached. A rule is CIDR[:PORTS[/PROTO]]:
"10.0.0.0/8", "192.0.2.7:443", "203.0.113.0/24:80,8000-8100/tcp". The
policy applies to running sandboxes at once; DNS always works.`,
	}
	c.AddCommand(newNamespaceSet(g, "create"), newNamespaceSet(g, "set"), newNamespaceList(g), newNamespaceDelete(g))
	return c
}

func newNamespaceSet(g *globals, verb string) *cobra.Command {
	var (
		q           spec.Quota
		allow, deny []string
		clearEgress bool
	)
	short := "Create a namespace with a quota and an egress policy"
	if verb == "set" {
		short = "Set a namespace's quota or egress policy (creating it if needed; what is not given is kept)"
	}
	c := &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Example: `  brisk ns create team-a --max-functions 20 --max-sandboxes 50 --max-cpu 8000 --max-memory 8192 --max-scale 20
  brisk ns set team-a --egress-allow 10.20.0.0/16:5432/tcp --egress-allow 203.0.113.10:443
  brisk ns set team-b --egress-deny 10.0.0.0/8 --egress-deny 192.168.0.0/16`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			var req api.NamespaceRequest
			fl := c.Flags()
			// The quota flags given replace those fields of the current
			// quota; the others keep their values.
			keepers := map[string]func(was spec.Quota){
				"max-functions": func(was spec.Quota) { q.MaxFunctions = was.MaxFunctions },
				"max-sandboxes": func(was spec.Quota) { q.MaxSandboxes = was.MaxSandboxes },
				"max-cpu":       func(was spec.Quota) { q.MaxMilliCPU = was.MaxMilliCPU },
				"max-memory":    func(was spec.Quota) { q.MaxMemoryMB = was.MaxMemoryMB },
				"max-scale":     func(was spec.Quota) { q.MaxScale = was.MaxScale },
			}
			if slices.ContainsFunc(slices.Collect(maps.Keys(keepers)), fl.Changed) {
				cur, err := g.client().Namespace(c.Context(), args[0])
				if err != nil && !client.IsNotFound(err) {
					return err
				}
				for name, keep := range keepers {
					if err == nil && !fl.Changed(name) {
						keep(cur.Quota)
					}
				}
				req.Quota = &q
			}
			if len(allow)+len(deny) > 0 || clearEgress {
				if clearEgress && len(allow)+len(deny) > 0 {
					return usageError{errors.New("--egress-clear removes the policy: give it without --egress-allow or --egress-deny")}
				}
				req.Egress = &spec.EgressPolicy{}
				for _, s := range allow {
					r, err := spec.ParseEgressRule(s)
					if err != nil {
						return usageError{fmt.Errorf("--egress-allow: %w", err)}
					}
					req.Egress.Allow = append(req.Egress.Allow, r)
				}
				for _, s := range deny {
					r, err := spec.ParseEgressRule(s)
					if err != nil {
						return usageError{fmt.Errorf("--egress-deny: %w", err)}
					}
					req.Egress.Deny = append(req.Egress.Deny, r)
				}
			}
			v, err := g.client().SetNamespace(c.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Printf("namespace %s: %s; egress: %s\n", v.Name, quotaText(v.Quota), egressText(v.Egress))
			return nil
		},
	}
	fl := c.Flags()
	fl.IntVar(&q.MaxFunctions, "max-functions", 0, "functions at most (0: unlimited)")
	fl.IntVar(&q.MaxSandboxes, "max-sandboxes", 0, "sandboxes of all its functions at once")
	fl.Int64Var(&q.MaxMilliCPU, "max-cpu", 0, "CPU (millicores) its sandboxes may request at once")
	fl.Int64Var(&q.MaxMemoryMB, "max-memory", 0, "memory (MiB) its sandboxes may request at once")
	fl.IntVar(&q.MaxScale, "max-scale", 0, "the highest scaling.max (and min) of one function")
	fl.StringArrayVar(&allow, "egress-allow", nil, "only these destinations, CIDR[:PORTS[/tcp|udp]] (repeatable; replaces the egress policy)")
	fl.StringArrayVar(&deny, "egress-deny", nil, "refuse these destinations, CIDR[:PORTS[/tcp|udp]] (repeatable; replaces the egress policy)")
	fl.BoolVar(&clearEgress, "egress-clear", false, "remove the egress policy (without egress flags it is kept)")
	return c
}

// egressText is a policy in the CLI's rule form.
func egressText(p spec.EgressPolicy) string {
	if p.IsZero() {
		return "unrestricted"
	}
	rule := func(r spec.EgressRule) string {
		s := r.CIDR
		if len(r.Ports) > 0 {
			s += ":" + strings.Join(r.Ports, ",")
			if r.Protocol != "" {
				s += "/" + r.Protocol
			}
		}
		return s
	}
	var parts []string
	for _, r := range p.Deny {
		parts = append(parts, "deny "+rule(r))
	}
	for _, r := range p.Allow {
		parts = append(parts, "allow "+rule(r))
	}
	if len(p.Allow) > 0 {
		parts = append(parts, "deny the rest")
	}
	return strings.Join(parts, ", ")
}

func quotaText(q spec.Quota) string {
	n := func(v int64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("functions %s, sandboxes %s, cpu %sm, memory %s MiB, scale %s",
		n(int64(q.MaxFunctions)), n(int64(q.MaxSandboxes)), n(q.MaxMilliCPU), n(q.MaxMemoryMB), n(int64(q.MaxScale)))
}

func newNamespaceList(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List namespaces with their quotas and use",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			nss, err := g.client().Namespaces(c.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(nss)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAMESPACE\tFUNCTIONS\tSANDBOXES\tCPU\tMEMORY MiB\tQUOTA\tEGRESS")
			for _, v := range nss {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%dm\t%d\t%s\t%s\n", v.Name, v.Usage.Functions, v.Usage.Sandboxes, v.Usage.MilliCPU, v.Usage.MemoryMB,
					quotaText(v.Quota), egressText(v.Egress))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newNamespaceDelete(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete an empty namespace (its functions must be deleted first)",
		Args:  exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := g.client().DeleteNamespace(c.Context(), args[0]); err != nil {
				return err
			}
			fmt.Printf("namespace %s deleted\n", args[0])
			return nil
		},
	}
}
