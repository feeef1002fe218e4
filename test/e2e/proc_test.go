package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// pidListening returns the pid of the process with a listening TCP socket
// on addr (127.0.0.1:port), found through /proc/net/tcp and fd links.
func pidListening(t *testing.T, addr string) int {
	t.Helper()
	_, portStr, ok := strings.Cut(addr, ":")
	if !ok {
		return 0
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return 0
	}
	inode := ""
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A = LISTEN
				continue
			}
			if strings.HasSuffix(f[1], fmt.Sprintf(":%04X", port)) {
				inode = f[9]
			}
		}
	}
	if inode == "" {
		return 0
	}
	want := "socket:[" + inode + "]"
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range procs {
		if link, err := os.Readlink(fd); err == nil && link == want {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}
