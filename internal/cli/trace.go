package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/tracefn"
)

// newTraceFn is the hidden command the process runtime starts for the
// built-in trace function: the brisk binary itself is the artifact.
func newTraceFn() *cobra.Command {
	return &cobra.Command{
		Use:    "__trace",
		Short:  "Serve the built-in trace function on $PORT (started by workers)",
		Hidden: true,
		Args:   exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			port := os.Getenv("PORT")
			if port == "" {
				return usageError{fmt.Errorf("PORT is not set")}
			}
			host := os.Getenv("BRISK_LISTEN_HOST")
			if host == "" {
				host = "127.0.0.1"
			}
			return tracefn.Serve(c.Context(), host+":"+port, tracefn.Config{
				SandboxID: os.Getenv("BRISK_SANDBOX_ID"), Function: os.Getenv("BRISK_FUNCTION")})
		},
	}
}
