// Package e2e starts real brisk processes on loopback and checks the cluster
// by its observable behaviour: HTTP answers, admin state, processes.
package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
)

var briskBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "brisk-e2e-bin")
	if err != nil {
		panic(err)
	}
	briskBin = filepath.Join(dir, "brisk")
	err = testutil.GoBuild("../../cmd/brisk", briskBin, false)
	if err == nil {
		// The lean trace function beside brisk, as make build installs it.
		err = testutil.GoBuild("../../cmd/brisk-trace", filepath.Join(dir, "brisk-trace"), true)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Every HTTP client of the tests (pkg/client included) authenticates
	// to the admin APIs of the clusters they started (registerAdmin).
	http.DefaultTransport = tokenTransport{base: http.DefaultTransport}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// adminDirs maps a cluster's admin address to the data dirs where its
// first admin token may be written (every replica's, for an HA cluster:
// the first leader writes it).
var adminDirs sync.Map // string -> []string

func registerAdmin(addr string, dirs ...string) { adminDirs.Store(addr, dirs) }

// adminToken is the admin token of the cluster at addr, or "".
func adminToken(addr string) string {
	dirs, ok := adminDirs.Load(addr)
	if !ok {
		return ""
	}
	for _, d := range dirs.([]string) {
		if tok, err := admin.ReadAdminToken(d); err == nil && tok != "" {
			return tok
		}
	}
	return ""
}

// tokenTransport adds the admin token of a registered cluster to requests
// that carry no Authorization of their own.
type tokenTransport struct{ base http.RoundTripper }

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Authorization") == "" {
		if tok := adminToken(r.URL.Host); tok != "" {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	return t.base.RoundTrip(r)
}

// syncBuffer collects a process's output for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startBrisk runs the brisk binary with args until the test ends (or stop).
func startBrisk(t testing.TB, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(briskBin, args...), out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting brisk %v: %v", args, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("output of brisk %s:\n%s", strings.Join(args, " "), tail(p.out.String(), tailBytes()))
		}
	})
	return p
}

// stop signals the process (by its PID) and waits for it.
func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// freePort returns a loopback address no one listens on, for a brisk
// process to bind a moment later. It is picked below the kernel's
// ephemeral range when there is room: a port from that range can be taken
// in between by any outgoing connection on the machine (a CI run failed
// with "address already in use" that way).
// It never hands out one address twice in a run: two picks for one
// cluster (its admin and NATS ports) once drew the same free port.
func freePort(t testing.TB) string {
	t.Helper()
	if lo := ephemeralLow(); lo > 11000 {
		for range 50 {
			addr := fmt.Sprintf("127.0.0.1:%d", 10000+rand.IntN(lo-10000))
			if !handOut(addr) {
				continue
			}
			if l, err := net.Listen("tcp", addr); err == nil {
				l.Close()
				return addr
			}
		}
	}
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if handOut(addr) {
			return addr
		}
	}
}

var (
	handedMu sync.Mutex
	handed   = map[string]bool{}
)

// handOut records addr as handed out; false if it already was.
func handOut(addr string) bool {
	handedMu.Lock()
	defer handedMu.Unlock()
	if handed[addr] {
		return false
	}
	handed[addr] = true
	return true
}

// ephemeralLow is the first port of the kernel's range for outgoing
// connections (0 if unknown).
func ephemeralLow() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(data), &lo, &hi); err != nil {
		return 0
	}
	return lo
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// joinArgs are the flags a worker or data plane joins the cluster whose
// control plane keeps its state in dataDir with: the join token it wrote
// (waited for: the leader of an HA control plane writes it) and its CA.
func joinArgs(t testing.TB, dataDirs ...string) []string {
	t.Helper()
	var args []string
	eventually(t, 30*time.Second, "a join token in the control plane's data dir", func() bool {
		for _, d := range dataDirs {
			if tok, err := pki.ReadSecretFile(filepath.Join(d, pki.JoinTokenFile)); err == nil && tok != "" {
				args = []string{"--join-token", tok, "--ca-cert", filepath.Join(d, pki.CACertFile)}
				return true
			}
		}
		return false
	})
	return args
}

// cluster is a brisk cluster under test.
type cluster struct {
	admin, invokeAddr, grpc string
	dataDir                 string
	cl                      *client.Client
	// With useTLS: https, the CA file the CLI is told to trust, and an
	// HTTP client trusting it (the admin token added by host, as for
	// every client of the tests).
	scheme string
	hc     *http.Client
	caEnv  []string // more environment for CLI commands
}

func newCluster(t testing.TB) *cluster {
	c := &cluster{admin: freePort(t), invokeAddr: freePort(t), grpc: freePort(t), dataDir: t.TempDir(), scheme: "http", hc: http.DefaultClient}
	c.cl = client.New(c.admin, c.invokeAddr)
	registerAdmin(c.admin, c.dataDir)
	registerAdmin(c.invokeAddr, c.dataDir) // functions need a token to be called
	return c
}

// env points CLI commands at the cluster, with its admin token.
func (c *cluster) env() []string {
	return []string{"BRISK_ADMIN=" + c.scheme + "://" + c.admin, "BRISK_INVOKE=" + c.scheme + "://" + c.invokeAddr,
		"BRISK_TOKEN_FILE=" + filepath.Join(c.dataDir, api.AdminTokenFile)}
}

// useTLS points the tests' clients at https:// URLs of a cluster whose
// listeners serve certificates of the CA in caFile.
func (c *cluster) useTLS(t *testing.T, caFile string) {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b) {
		t.Fatalf("no certificate in %s", caFile)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	t.Cleanup(tr.CloseIdleConnections)
	c.scheme = "https"
	c.hc = &http.Client{Transport: tokenTransport{base: tr}, Timeout: time.Minute}
	c.cl = client.New("https://"+c.admin, "https://"+c.invokeAddr)
	c.cl.HTTP = c.hc
}

// cpArgs are control-plane flags tuned so tests run in seconds.
func (c *cluster) cpArgs() []string {
	return []string{"--data-dir", c.dataDir, "--admin", c.admin, "--grpc", c.grpc,
		"--autoscale-interval", "200ms", "--drain-delay", "100ms", "--startup-grace", "3s", "--log-level", "debug"}
}

// up starts a one-process cluster.
func (c *cluster) up(t testing.TB, extra ...string) *proc {
	p := startBrisk(t, append(append([]string{"up", "--invoke", c.invokeAddr}, c.cpArgs()...), extra...)...)
	c.waitHealthy(t, p)
	return p
}

func (c *cluster) waitHealthy(t testing.TB, p *proc) {
	t.Helper()
	eventually(t, 30*time.Second, "cluster healthy", func() bool {
		select {
		case <-p.done:
			t.Fatalf("brisk exited early:\n%s", tail(p.out.String(), 4000))
		default:
		}
		st, err := c.cl.Status(context.Background())
		return err == nil && len(st.Nodes) > 0 && st.Nodes[0].Connected && c.httpOK(c.scheme+"://"+c.invokeAddr+"/healthz")
	})
}

func httpOK(url string) bool { return httpOKWith(http.DefaultClient, url) }

// httpOK is httpOK with the cluster's HTTP client.
func (c *cluster) httpOK(url string) bool { return httpOKWith(c.hc, url) }

func httpOKWith(hc *http.Client, url string) bool {
	resp, err := hc.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// brisk runs a client command against the cluster and returns its output
// and exit code.
func (c *cluster) brisk(t testing.TB, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(briskBin, args...)
	cmd.Env = append(append(os.Environ(), c.env()...), c.caEnv...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running brisk %v: %v", args, err)
	}
	return string(out), code
}

func (c *cluster) mustBrisk(t testing.TB, args ...string) string {
	t.Helper()
	out, code := c.brisk(t, args...)
	if code != 0 {
		t.Fatalf("brisk %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

func (c *cluster) fn(t testing.TB, name string) *api.FunctionView {
	t.Helper()
	v, err := c.cl.Get(context.Background(), name)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return v
}

type invocation struct {
	status  int
	body    []byte
	sandbox string
	cold    bool
	reply   traceReply
}

type traceReply struct {
	Sandbox string `json:"sandbox"`
	ExecUs  int64  `json:"exec_us"`
}

// invoke posts body to /function/name.
func (c *cluster) invoke(t *testing.T, name, body string) invocation {
	t.Helper()
	resp, err := c.hc.Post(c.scheme+"://"+c.invokeAddr+"/function/"+name, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("invoke %s: %v", name, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	inv := invocation{status: resp.StatusCode, body: data, sandbox: resp.Header.Get("X-Brisk-Sandbox"),
		cold: strings.Contains(resp.Header.Get("X-Brisk-Timing"), "cold=true")}
	_ = json.Unmarshal(data, &inv.reply)
	return inv
}

// tailBytes is how much of a failed test's brisk output is logged:
// BRISK_E2E_LOG_BYTES, default 6000.
func tailBytes() int {
	if n, err := strconv.Atoi(os.Getenv("BRISK_E2E_LOG_BYTES")); err == nil && n > 0 {
		return n
	}
	return 6000
}

// connectedCount is how many workers and data planes the control plane
// sees connected.
func connectedCount(st *api.StatusView) (nodes, dataPlanes int) {
	for _, n := range st.Nodes {
		if n.Connected {
			nodes++
		}
	}
	for _, d := range st.DataPlanes {
		if d.Connected {
			dataPlanes++
		}
	}
	return nodes, dataPlanes
}
