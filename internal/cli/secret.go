package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newSecret(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "secret",
		Short: "Manage secrets functions read as files",
		Long: `A secret is a named value in a namespace. A function that lists it
(fn deploy --secret NAME, or "secrets" in its spec) reads it in every
sandbox as the read-only file ` + spec.SecretsDir + `/NAME, OpenFaaS's
path. Values are never shown back. An update reaches sandboxes started
after it; redeploy a function to roll the ones it has.`,
	}
	c.AddCommand(newSecretSet(g, "create"), newSecretSet(g, "update"), newSecretList(g), newSecretRemove(g))
	return c
}

func newSecretSet(g *globals, verb string) *cobra.Command {
	var literal, file, ns string
	short := "Create a secret"
	if verb == "update" {
		short = "Replace a secret's value"
	}
	c := &cobra.Command{
		Use:   verb + " NAME [--from-literal VALUE | --from-file PATH | < VALUE]",
		Short: short,
		Example: "  brisk secret " + verb + " db-password --from-literal s3cret\n" +
			"  brisk secret " + verb + " tls-key --from-file key.pem -n team-a\n" +
			"  printf %s \"$TOKEN\" | brisk secret " + verb + " api-token",
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			value, err := secretInput(c, literal, file)
			if err != nil {
				return err
			}
			req := api.SecretRequest{Name: args[0], Namespace: ns, RawValue: value}
			var v *api.SecretView
			if verb == "update" {
				v, err = g.client().UpdateSecret(c.Context(), req)
			} else {
				v, err = g.client().CreateSecret(c.Context(), req)
			}
			if err != nil {
				return err
			}
			fmt.Printf("secret %s/%s: %d bytes\n", v.Namespace, v.Name, v.Size)
			if verb == "update" && len(v.UsedBy) > 0 {
				fmt.Printf("used by %s: their new sandboxes see the new value (redeploy to roll the others)\n", strings.Join(v.UsedBy, ", "))
			}
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&literal, "from-literal", "", "the value, as given")
	fl.StringVar(&file, "from-file", "", "read the value from this file")
	fl.StringVarP(&ns, "namespace", "n", "", "namespace (default: the token's, else default)")
	return c
}

// secretInput reads a secret's value from a flag, a file or stdin (not a
// terminal: a typed value would echo).
func secretInput(c *cobra.Command, literal, file string) ([]byte, error) {
	switch {
	case c.Flags().Changed("from-literal") && file != "":
		return nil, errors.New("give --from-literal or --from-file, not both")
	case c.Flags().Changed("from-literal"):
		return []byte(literal), nil
	case file != "":
		return readLimited(func() (io.ReadCloser, error) { return os.Open(file) }, file)
	}
	if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
		return nil, errors.New("no value: give --from-literal, --from-file, or pipe it on stdin")
	}
	return readLimited(func() (io.ReadCloser, error) { return io.NopCloser(os.Stdin), nil }, "stdin")
}

func readLimited(open func() (io.ReadCloser, error), what string) ([]byte, error) {
	r, err := open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, spec.MaxSecretSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if len(b) > spec.MaxSecretSize {
		return nil, fmt.Errorf("%s: a secret holds at most %d bytes", what, spec.MaxSecretSize)
	}
	return b, nil
}

func newSecretList(g *globals) *cobra.Command {
	var asJSON bool
	var ns string
	c := &cobra.Command{
		Use:   "list",
		Short: "List secrets (names and sizes, never values)",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			secs, err := g.client().Secrets(c.Context(), ns)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(secs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAMESPACE\tNAME\tSIZE\tUPDATED")
			for _, s := range secs {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", s.Namespace, s.Name, s.Size, s.UpdatedAt.Format("2006-01-02 15:04:05"))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().StringVarP(&ns, "namespace", "n", "", "only this namespace (default: all the token sees)")
	return c
}

func newSecretRemove(g *globals) *cobra.Command {
	var ns string
	c := &cobra.Command{
		Use:     "remove NAME",
		Aliases: []string{"rm", "delete"},
		Short:   "Delete a secret no function uses",
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := g.client().DeleteSecret(c.Context(), ns, args[0]); err != nil {
				return err
			}
			fmt.Printf("secret %s deleted\n", args[0])
			return nil
		},
	}
	c.Flags().StringVarP(&ns, "namespace", "n", "", "namespace (default: the token's, else default)")
	return c
}
