package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/tracefn"
)

// newTraceFn is the hidden command serving the built-in trace function
// where the lean brisk-trace binary is not installed beside brisk.
func newTraceFn() *cobra.Command {
	return &cobra.Command{
		Use:    "__trace",
		Short:  "Serve the built-in trace function on $PORT (started by workers)",
		Hidden: true,
		Args:   exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			addr, cfg, err := tracefn.FromEnv(os.Getenv)
			if err != nil {
				return usageError{err}
			}
			return tracefn.Serve(c.Context(), addr, cfg)
		},
	}
}
