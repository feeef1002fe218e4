package cli

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

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
its sandboxes and what they request. Quota fields of 0 are unlimited.`,
	}
	c.AddCommand(newNamespaceSet(g, "create"), newNamespaceSet(g, "set"), newNamespaceList(g), newNamespaceDelete(g))
	return c
}

func newNamespaceSet(g *globals, verb string) *cobra.Command {
	var q spec.Quota
	short := "Create a namespace with a quota"
	if verb == "set" {
		short = "Set a namespace's quota (creating it if needed)"
	}
	c := &cobra.Command{
		Use:     verb + " NAME",
		Short:   short,
		Example: "  brisk ns create team-a --max-functions 20 --max-sandboxes 50 --max-cpu 8000 --max-memory 8192 --max-scale 20",
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			v, err := g.client().PutNamespace(c.Context(), args[0], q)
			if err != nil {
				return err
			}
			fmt.Printf("namespace %s: %s\n", v.Name, quotaText(v.Quota))
			return nil
		},
	}
	fl := c.Flags()
	fl.IntVar(&q.MaxFunctions, "max-functions", 0, "functions at most (0: unlimited)")
	fl.IntVar(&q.MaxSandboxes, "max-sandboxes", 0, "sandboxes of all its functions at once")
	fl.Int64Var(&q.MaxMilliCPU, "max-cpu", 0, "CPU (millicores) its sandboxes may request at once")
	fl.Int64Var(&q.MaxMemoryMB, "max-memory", 0, "memory (MiB) its sandboxes may request at once")
	fl.IntVar(&q.MaxScale, "max-scale", 0, "the highest scaling.max (and min) of one function")
	return c
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
			fmt.Fprintln(tw, "NAMESPACE\tFUNCTIONS\tSANDBOXES\tCPU\tMEMORY MiB\tQUOTA")
			for _, v := range nss {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%dm\t%d\t%s\n", v.Name, v.Usage.Functions, v.Usage.Sandboxes, v.Usage.MilliCPU, v.Usage.MemoryMB, quotaText(v.Quota))
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
