// Command brisk-sandbox-init is the first program of every sandbox of the
// native runtime (see internal/worker/runtime/native/nsinit). It does what
// `brisk __native-init` does from a binary that links only the standard
// library and x/sys, so that a pool of parked sandboxes refills quickly.
// Workers use it when it sits next to the brisk binary; `make build` puts
// it there.
package main

import "github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"

func main() { nsinit.Main() }
