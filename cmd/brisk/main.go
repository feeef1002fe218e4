// Command brisk is the one binary of the brisk FaaS cluster manager: every
// component, the local all-in-one cluster, and the client commands.
package main

import (
	"os"

	"github.com/brisk-faas/brisk/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
