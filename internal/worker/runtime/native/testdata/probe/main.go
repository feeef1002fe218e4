// Command probe is the native runtime tests' function: a static HTTP server
// on 0.0.0.0:$PORT that replies to every request with what it can see of its
// sandbox as JSON: who it runs as, its capability and seccomp state, its
// PID namespace, hostname, whether its devices work, and which writes and syscalls succeed; GET
// /secrets answers what it sees of its secrets (secretsprobe). With
// PROBE_MODE=exit it exits with status 3 at once; with PROBE_MODE=zombie its
// main thread exits while the others serve.
package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest/secretsprobe"
)

func init() {
	if os.Getenv("PROBE_MODE") == "zombie" {
		runtime.LockOSThread() // main runs on the main thread, which then exits
	}
}

func main() {
	if os.Getenv("PROBE_MODE") == "exit" {
		os.Exit(3)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", os.Getenv("PORT")))
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("probe listening\n")
	serve := func() {
		_ = http.Serve(l, http.HandlerFunc(handle))
	}
	if os.Getenv("PROBE_MODE") == "zombie" {
		// PID 1's main thread exits and the others serve on: the process
		// is a zombie to /proc while it runs, which teardown must still end.
		go serve()
		syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
	}
	serve()
}

func handle(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case secretsprobe.Path:
		secretsprobe.ServeHTTP(w, r)
		return
	case "/net":
		// What the sandbox's network gives it: its /etc/resolv.conf and
		// /etc/hosts, a name looked up through them (?name=), a URL
		// fetched (?url=), and a TCP connect's error (?dial=).
		out := map[string]string{}
		for _, f := range []string{"/etc/resolv.conf", "/etc/hosts"} {
			b, err := os.ReadFile(f)
			out[f] = string(b)
			if err != nil {
				out[f] = "error: " + err.Error()
			}
		}
		q := r.URL.Query()
		if name := q.Get("name"); name != "" {
			addrs, err := net.LookupHost(name)
			out["lookup"] = strings.Join(addrs, ",")
			if err != nil {
				out["lookup"] = "error: " + err.Error()
			}
		}
		if u := q.Get("url"); u != "" {
			c := http.Client{Timeout: 20 * time.Second}
			if resp, err := c.Get(u); err != nil {
				out["fetch"] = "error: " + err.Error()
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				out["fetch"] = string(b)
			}
		}
		if a := q.Get("dial"); a != "" {
			out["dial"] = "connected"
			if c, err := net.DialTimeout("tcp", a, 20*time.Second); err != nil {
				out["dial"] = "error: " + err.Error()
			} else {
				c.Close()
			}
		}
		_ = json.NewEncoder(w).Encode(out)
		return
	}
	_ = json.NewEncoder(w).Encode(probe())
}

func probe() map[string]any {
	status := map[string]string{}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				status[k] = strings.TrimSpace(v)
			}
		}
	}
	host, _ := os.Hostname()
	pids := 0
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			if e.Name()[0] >= '0' && e.Name()[0] <= '9' {
				pids++
			}
		}
	}
	write := func(p string) bool {
		f, err := os.Create(p)
		if err != nil {
			return false
		}
		f.Close()
		return true
	}
	// unshare(CLONE_NEWUSER) needs no privilege on this kernel; the default
	// seccomp profile denies it.
	_, _, unshareErr := syscall.RawSyscall(syscall.SYS_UNSHARE, syscall.CLONE_NEWUSER, 0, 0)
	// The devices a container has: random bytes in, anything out.
	devs := false
	if f, err := os.Open("/dev/urandom"); err == nil {
		b := make([]byte, 8)
		_, err = f.Read(b)
		f.Close()
		devs = err == nil && os.WriteFile("/dev/null", b, 0) == nil
	}
	ifaces := []string{}
	if is, err := net.Interfaces(); err == nil {
		for _, i := range is {
			ifaces = append(ifaces, i.Name)
		}
	}
	// A root sandbox must not reach the host's kernel settings: /proc/sys
	// read-only, /proc/keys and the like masked (runc's readonly and masked
	// paths).
	procSys := "writable"
	if f, err := os.OpenFile("/proc/sys/kernel/core_pattern", os.O_WRONLY, 0); err != nil {
		procSys = err.Error()
	} else {
		f.Close()
	}
	// /proc/keys lists the host's keyrings (it exists where /proc/kcore
	// may not): masked, it is /dev/null.
	keys := "visible"
	if st, err := os.Stat("/proc/keys"); err != nil {
		keys = err.Error()
	} else if st.Mode()&os.ModeCharDevice != 0 {
		keys = "masked"
	}
	// A descriptor the worker had open without close-on-exec
	// (PROBE_LEAK_FD) must not reach the function.
	leaked := false
	if fd := os.Getenv("PROBE_LEAK_FD"); fd != "" {
		_, err := os.Stat("/proc/self/fd/" + fd)
		leaked = err == nil
	}
	return map[string]any{
		"proc_sys": procSys, "proc_keys": keys, "leaked_fd": leaked,
		"uid": os.Getuid(), "gid": os.Getgid(), "pid": os.Getpid(), "pids": pids, "hostname": host,
		"cap_eff": status["CapEff"], "cap_bnd": status["CapBnd"], "no_new_privs": status["NoNewPrivs"],
		"seccomp": status["Seccomp"], "unshare_errno": int(unshareErr),
		"tmp_writable": write("/tmp/written-by-probe"), "root_writable": write("/written-by-probe"),
		"sandbox": os.Getenv("BRISK_SANDBOX_ID"), "image_env": os.Getenv("IMAGE_ENV"), "interfaces": ifaces, "devices": devs,
	}
}
