//go:build cgo && amd64

package nsinit

// init.c's constructor is the init; nothing of it is called from Go. Other
// architectures have no init (Main says so).

// #cgo CFLAGS: -O2 -Wall -Wextra -Wno-unused-parameter
import "C"
