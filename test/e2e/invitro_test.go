package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The InVitro loader's Dirigent contract (registration form, Host-routed
// calls with its headers over h1 and h2c, ExecutionTime in µs), sent as the
// loader sends it (its requests as recorded in the loader's source,
// pkg/driver/deployment/dirigent.go and its HTTP invoker).
func TestDirigentLoaderProtocol(t *testing.T) {
	c := newCluster(t)
	reg := freePort(t)
	c.up(t, "--dirigent-registration", reg, "--dirigent-keep-alive", "5s")
	tok, err := os.ReadFile(filepath.Join(c.dataDir, api.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	name := "trace-func-9-8156885230220795261"
	form := url.Values{
		"name": {name}, "image": {"docker.io/cvetkovic/dirigent_empty_function:latest"},
		"port_forwarding": {"80", "tcp"}, "scaling_upper_bound": {"200"}, "scaling_lower_bound": {"0"},
		"requested_cpu": {"100"}, "requested_memory": {"64"}, "env_vars": {""}, "prepull_mode": {"none"},
		"num_args": {"0"}, "num_rets": {"0"}, "requested_gpu": {"0"}, "node_affinity": {""}, "node_port": {"0"},
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}} // no token added by the harness
	// The loader's DirigentControlPlaneIP, written user:TOKEN@host:port,
	// makes Go's client send the token as basic auth.
	base := "http://loader:" + strings.TrimSpace(string(tok)) + "@" + reg
	resp, err := hc.PostForm("http://"+reg+"/", form)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(msg), "user:TOKEN@host:port") {
		t.Fatalf("registration without a token: %d %s, want 401 saying how to send one", resp.StatusCode, msg)
	}
	register := func(f url.Values) string {
		t.Helper()
		resp, err := hc.PostForm(base+"/", f)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK { // exactly 200: the loader counts 201 as an error
			t.Fatalf("registration: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	if got := register(form); got != c.invokeAddr {
		t.Fatalf("registration reply %q, want the data plane %q", got, c.invokeAddr)
	}
	v := c.fn(t, name)
	if v.Builtin != "trace" || v.Scaling.Max != 200 || v.Resources.MilliCPU != 100 || v.Resources.MemoryMB != 64 || v.Limits.MemoryMB != 64*10+64 || v.Auth != "public" ||
		time.Duration(v.Scaling.StableWindow) != 5*time.Second || time.Duration(v.Queue.Timeout) != spec.DefaultCaps().MaxQueueTimeout {
		t.Fatalf("registered spec %+v", v.Function)
	}
	form.Set("scaling_upper_bound", "50") // registering again updates
	register(form)
	if v := c.fn(t, name); v.Scaling.Max != 50 {
		t.Fatalf("re-registration kept max %d", v.Scaling.Max)
	}
	for q, want := range map[string]int{name: 200, "not-registered": 404} {
		resp, err := hc.Get(base + "/check?name=" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("check %s: %d, want %d", q, resp.StatusCode, want)
		}
	}

	// Calls: POST / with Host: NAME and the loader's headers, over h1 and h2c.
	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	for proto, tr := range map[string]*http.Transport{"HTTP/1.1": {}, "HTTP/2.0": h2c} {
		cl := &http.Client{Timeout: 30 * time.Second, Transport: tr}
		req, _ := http.NewRequest("POST", "http://"+c.invokeAddr+"/", nil)
		req.Host = name
		for k, v := range map[string]string{"workload": "empty", "function": name, "requested_cpu": "30", "requested_memory": "16", "multiplier": "0", "io_percentage": "0"} {
			req.Header[k] = []string{v} // as sent: lower case, underscores
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s call: %v", proto, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var reply struct {
			Status        string
			Function      string
			MachineName   string
			ExecutionTime int64
		}
		if resp.StatusCode != 200 || resp.Proto != proto || json.Unmarshal(b, &reply) != nil {
			t.Fatalf("%s call: %d %s %s", proto, resp.StatusCode, resp.Proto, b)
		}
		if reply.ExecutionTime < 30_000 || reply.Status == "" || reply.Function == "" {
			t.Fatalf("%s call: reply %+v, want ExecutionTime ≥ 30000 µs", proto, reply)
		}
	}
}
