package cli

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/api"
)

func newToken(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke API tokens",
		Long: `API tokens authenticate every call to the admin API (and invocations of
functions that ask for one). Scopes: admin (everything), deploy (manage
functions, read status), invoke (call functions). A token may be limited
to some functions with --function. The first admin token of a new cluster
is in <data-dir>/admin.token, which the CLI reads by default.`,
	}
	c.AddCommand(newTokenCreate(g), newTokenList(g), newTokenRevoke(g), newTokenAWS(g))
	return c
}

func newTokenAWS(g *globals) *cobra.Command {
	var envFormat bool
	c := &cobra.Command{
		Use:   "aws [TOKEN]",
		Short: "Print a token's AWS credentials, for Lambda API clients (boto3, the aws CLI, AWS SDKs)",
		Long: `Print the access key id and secret access key with which AWS clients sign
Lambda Invoke API calls (POST /2015-03-31/functions/NAME/invocations) for a
token: the one given, else --token or --token-file's. They are derived from
the token; a token made before brisk spoke the Lambda API has no key on
the data planes (create a new one). The call has the
token's scopes.`,
		Example: `  eval "$(brisk token aws --env)"
  aws lambda invoke --region us-east-1 --endpoint-url http://127.0.0.1:8080 --function-name hello out.json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			tok := g.apiToken()
			if len(args) == 1 {
				tok = strings.TrimSpace(args[0])
			}
			id, secret, ok := auth.AWSCredentials(tok)
			if !ok {
				return usageError{fmt.Errorf("no brisk token to derive keys from (give one, or --token / --token-file)")}
			}
			if envFormat {
				fmt.Printf("export AWS_ACCESS_KEY_ID=%s\nexport AWS_SECRET_ACCESS_KEY=%s\n", id, secret)
				return nil
			}
			fmt.Printf("aws_access_key_id = %s\naws_secret_access_key = %s\n", id, secret)
			return nil
		},
	}
	c.Flags().BoolVar(&envFormat, "env", false, "print shell export lines (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
	return c
}

func newTokenCreate(g *globals) *cobra.Command {
	var scopes, fns []string
	var ns string
	var quiet bool
	c := &cobra.Command{
		Use:     "create NAME",
		Short:   "Create a token; its secret is printed once",
		Example: "  brisk token create ci --scope deploy\n  brisk token create caller --scope invoke --function hello",
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			v, err := g.client().CreateToken(c.Context(), api.TokenRequest{Name: args[0], Scopes: scopes, Functions: fns, Namespace: ns})
			if err != nil {
				return err
			}
			if quiet {
				fmt.Println(v.Token)
				return nil
			}
			fmt.Printf("token %s (%s), scopes %s", v.ID, v.Name, strings.Join(v.Scopes, ","))
			if len(v.Functions) > 0 {
				fmt.Printf(", functions %s", strings.Join(v.Functions, ","))
			}
			fmt.Printf("\n%s\n", v.Token)
			fmt.Fprintln(os.Stderr, "(shown once: store it now; send it as Authorization: Bearer <token>)")
			return nil
		},
	}
	c.Flags().StringSliceVar(&scopes, "scope", []string{"invoke"}, "scopes: admin, deploy, invoke, join (join: workers and data planes join the cluster with it; repeatable or comma-separated)")
	c.Flags().StringSliceVar(&fns, "function", nil, "limit the token to these functions (repeatable)")
	c.Flags().StringVar(&ns, "namespace", "", "bind the token to a namespace: it sees and touches only its functions (not with --scope admin)")
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the token")
	return c
}

func newTokenList(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List tokens (never their secrets)",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			toks, err := g.client().Tokens(c.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(toks)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tNAMESPACE\tFUNCTIONS\tCREATED")
			for _, t := range toks {
				fns := "*"
				if len(t.Functions) > 0 {
					fns = strings.Join(t.Functions, ",")
				}
				ns := t.Namespace
				if ns == "" {
					ns = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, strings.Join(t.Scopes, ","), ns, fns, t.CreatedAt.Format("2006-01-02 15:04:05"))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func newTokenRevoke(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token: it stops working at once",
		Args:  exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if err := g.client().RevokeToken(c.Context(), args[0]); err != nil {
				return err
			}
			fmt.Printf("token %s revoked\n", args[0])
			return nil
		},
	}
}
