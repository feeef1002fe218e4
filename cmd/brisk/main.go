// Command brisk is the one binary of the brisk FaaS cluster manager: every
// component, the local all-in-one cluster, and the client commands.
package main

import (
	"os"
	// Cron triggers' time zones on hosts without a zone database.
	_ "time/tzdata"

	"github.com/brisk-faas/brisk/internal/cli"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
)

func main() {
	// A native sandbox's init, when brisk-sandbox-init is not installed:
	// before anything else, as it runs inside the sandbox.
	if len(os.Args) > 1 && os.Args[1] == nsinit.Subcommand {
		nsinit.Main()
	}
	os.Exit(cli.Main(os.Args[1:]))
}
