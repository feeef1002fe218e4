package cli

import (
	"fmt"
	"net/url"
	"os"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/pkg/client"
)

func newUI(g *globals) *cobra.Command {
	var noToken bool
	c := &cobra.Command{
		Use:   "ui",
		Short: "Print the web dashboard's address, with the API token to open it",
		Long: `Print the address of the control plane's web dashboard (/ui/ on the admin
API: nodes, functions, sandboxes by state, call and cold-start rates,
latency percentiles, recent failures, updated every two seconds).

The API token (--token, or the one in --token-file) goes in the address's
fragment, /ui/#token=...: browsers do not send the fragment to the server.
The page keeps the token for the tab (sessionStorage) and sends it only to
the control plane, with each GET /v1/dashboard; it needs the deploy or admin
scope. With --no-token, or when there is no token, the bare address is
printed and the page asks for one.`,
		Example: `  brisk ui
  xdg-open "$(brisk ui)"`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			u := client.New(g.admin, g.invoke).Admin + "/ui/"
			tok := ""
			if !noToken {
				tok = g.apiToken()
				if tok == "" {
					fmt.Fprintf(os.Stderr, "no API token (--token, BRISK_TOKEN or %s): the page will ask for one\n", g.tokenFile)
				}
			}
			if tok != "" {
				u += "#token=" + url.QueryEscape(tok)
			}
			fmt.Println(u)
			return nil
		},
	}
	c.Flags().BoolVar(&noToken, "no-token", false, "print the address without the token (the page asks for one)")
	return c
}
