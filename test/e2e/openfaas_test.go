package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
)

// The OpenFaaS gateway API as faas-cli drives it: login, deploy (PUT, then
// POST on 404), list, describe, invoke and async invoke with the namespace
// suffix and no credentials, scale, info, namespaces, remove. faas-cli
// cannot be fetched here, so the test sends the requests it sends (as
// recorded from faas-cli against a recording server), with its headers.
func TestOpenFaaSGatewayAPI(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	tok, err := os.ReadFile(filepath.Join(c.dataDir, api.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	gw := "http://" + c.invokeAddr
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+strings.TrimSpace(string(tok))))
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}} // no token added by the harness
	do := func(method, path, authz, body string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(method, gw+path, strings.NewReader(body))
		req.Header.Set("User-Agent", "faas-cli/0.17.0")
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}

	// faas-cli login checks the credentials with a list.
	if code, _, _ := do("GET", "/system/functions", basic, ""); code != 200 {
		t.Fatalf("login: %d", code)
	}
	if code, _, _ := do("GET", "/system/functions", "Basic "+base64.StdEncoding.EncodeToString([]byte("admin:wrong")), ""); code != 401 {
		t.Fatalf("login with a wrong password: %d, want 401", code)
	}
	dep := `{"service":"env-test","image":"brisk.dev/builtin/trace","namespace":"openfaas-fn","envVars":{"custom_env":"custom_env_value"},
	  "labels":{"com.openfaas.scale.min":"1","com.openfaas.scale.max":"4","team":"a"},"annotations":{"topic":"x.y","json":"{\"a\":1}"},
	  "constraints":["node.platform.os == linux"],"limits":{"memory":"256Mi","cpu":"500m"},"requests":{"memory":"64Mi","cpu":"100m"}}`
	// deploy: PUT first (an update); 404 for a new function makes faas-cli POST.
	if code, _, body := do("PUT", "/system/functions", basic, dep); code != 404 {
		t.Fatalf("PUT of an unknown function: %d %s, want 404", code, body)
	}
	if code, _, body := do("POST", "/system/functions", basic, dep); code/100 != 2 {
		t.Fatalf("deploy: %d %s", code, body)
	}
	code, _, body := do("GET", "/system/functions?namespace=openfaas-fn", basic, "")
	var list []map[string]any
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list) != 1 {
		t.Fatalf("list: %d %s", code, body)
	}
	code, _, body = do("GET", "/system/function/env-test?namespace=openfaas-fn&usage=1", basic, "")
	var st struct {
		Name, Image, Namespace string
		EnvVars                map[string]string
		Labels                 map[string]string
		Annotations            map[string]string
		Constraints            []string
		Limits, Requests       struct{ Memory, CPU string }
		Replicas               int
	}
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("describe: %d %s", code, body)
	}
	if st.Name != "env-test" || st.Image != "brisk.dev/builtin/trace" || st.Namespace != "openfaas-fn" || st.EnvVars["custom_env"] != "custom_env_value" ||
		st.Labels["faas_function"] != "env-test" || st.Labels["team"] != "a" || st.Annotations["json"] != `{"a":1}` ||
		len(st.Constraints) != 1 || st.Limits.Memory != "256Mi" || st.Requests.CPU != "100m" {
		t.Fatalf("describe: %+v", st)
	}
	if v := c.fn(t, "env-test"); v.Scaling.Min != 1 || v.Scaling.Max != 4 {
		t.Fatalf("scale labels not applied: %+v", v.Scaling)
	}
	// invoke: /function/NAME.NAMESPACE, no credentials.
	eventually(t, 30*time.Second, "env-test answers", func() bool {
		code, h, body := do("POST", "/function/env-test.openfaas-fn?q=1", "", `{"ms": 1}`)
		return code == 200 && h.Get("X-Call-Id") != "" && strings.Contains(body, "requested_ms")
	})
	code, h, _ := do("POST", "/async-function/env-test.openfaas-fn", "", `{"ms": 1}`)
	if code != 202 || h.Get("X-Call-Id") == "" {
		t.Fatalf("async invoke: %d %v", code, h)
	}
	if code, _, body := do("POST", "/system/scale-function/env-test", basic, `{"serviceName":"env-test","replicas":2,"namespace":"openfaas-fn"}`); code/100 != 2 {
		t.Fatalf("scale: %d %s", code, body)
	}
	if v := c.fn(t, "env-test"); v.Scaling.Min != 2 {
		t.Fatalf("scale to 2: min %d", v.Scaling.Min)
	}
	code, _, body = do("GET", "/system/info", basic, "")
	var info struct {
		Provider struct {
			Provider, Orchestration string
			Version                 struct{ Release, SHA string }
		}
		Version struct{ Release, SHA string }
	}
	if code != 200 || json.Unmarshal([]byte(body), &info) != nil || info.Provider.Provider == "" || info.Provider.Orchestration == "" ||
		info.Provider.Version.Release == "" || info.Provider.Version.SHA == "" || info.Version.Release == "" || info.Version.SHA == "" {
		t.Fatalf("info: %d %s", code, body)
	}
	if code, _, body := do("GET", "/system/namespaces", basic, ""); code != 200 || !strings.Contains(body, `"openfaas-fn"`) {
		t.Fatalf("namespaces: %d %s", code, body)
	}
	if code, _, _ := do("POST", "/function/.openfaas-fn", "", ""); code != 404 && code != 502 {
		t.Fatalf("invoke with an empty name: %d, want 404 or 502", code)
	}
	// A classic-watchdog function (the certifier's env-test-verbs): no
	// image brisk can run, an fprocess it forks per request.
	if code, _, body := do("POST", "/system/functions", basic, `{"service":"env-verbs","image":"functions/alpine:latest","envProcess":"env"}`); code/100 != 2 {
		t.Fatalf("deploy env-verbs: %d %s", code, body)
	}
	for _, verb := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
		var body string
		eventually(t, 30*time.Second, "env-verbs answers "+verb, func() bool {
			var code int
			code, h, body = do(verb, "/function/env-verbs.openfaas-fn?testing=1", "", "")
			return code == 200 && h.Get("X-Call-Id") != ""
		})
		if !strings.Contains(body, "Http_Method="+verb) || !strings.Contains(body, "Http_Query=testing=1") {
			t.Fatalf("%s: the watchdog's environment lacks the request:\n%s", verb, body)
		}
	}
	if _, _, body := do("GET", "/system/function/env-verbs", basic, ""); !strings.Contains(body, `"image":"functions/alpine:latest"`) || !strings.Contains(body, `"envProcess":"env"`) {
		t.Fatalf("env-verbs as described: %s", body)
	}
	// Logs: the watchdog's lines, through /system/logs (the certifier's
	// Test_FunctionLogs) and brisk fn logs.
	eventually(t, 30*time.Second, "the watchdog's log lines", func() bool {
		code, _, body := do("GET", "/system/logs?name=env-verbs&tail=100", basic, "")
		return code == 200 && strings.Contains(body, "Forking fprocess") && strings.Contains(body, "Wrote ") && strings.Contains(body, `"namespace":"openfaas-fn"`)
	})
	if out := c.mustBrisk(t, "fn", "logs", "env-verbs", "--tail", "2"); !strings.Contains(out, "Wrote ") || strings.Count(out, "\n") != 2 {
		t.Fatalf("brisk fn logs --tail 2: want the function's last 2 lines:\n%s", out)
	}
	// faas-cli logs NAME sends tail=-1 (all), also with --since; --lines N
	// is the function's last N lines, not N per sandbox (issue 38).
	for _, q := range []string{"tail=-1", "tail=-1&since=" + url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))} {
		if code, _, body := do("GET", "/system/logs?name=env-verbs&namespace=openfaas-fn&follow=false&"+q, basic, ""); code != 200 || !strings.Contains(body, "Forking fprocess") {
			t.Fatalf("faas-cli logs (%s): %d %s", q, code, body)
		}
	}
	// Two sandboxes with lines each: still 3 lines.
	if code, _, body := do("POST", "/system/scale-function/env-verbs", basic, `{"serviceName":"env-verbs","replicas":2,"namespace":"openfaas-fn"}`); code/100 != 2 {
		t.Fatalf("scale env-verbs: %d %s", code, body)
	}
	eventually(t, 60*time.Second, "lines from two sandboxes", func() bool {
		var wg sync.WaitGroup
		for range 4 { // at once: calls in a row may all go to one sandbox
			wg.Go(func() { do("POST", "/function/env-verbs.openfaas-fn", "", "") })
		}
		wg.Wait()
		_, _, body := do("GET", "/system/logs?name=env-verbs&namespace=openfaas-fn&follow=false&tail=-1", basic, "")
		instances := map[string]int{}
		for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
			var v struct{ Instance string }
			if json.Unmarshal([]byte(l), &v) == nil {
				instances[v.Instance]++
			}
		}
		n := 0
		for _, c := range instances {
			if c >= 3 {
				n++
			}
		}
		return n >= 2
	})
	if code, _, body := do("GET", "/system/logs?name=env-verbs&namespace=openfaas-fn&follow=false&tail=3", basic, ""); code != 200 || strings.Count(body, "\n") != 3 {
		t.Fatalf("faas-cli logs --lines 3 of two sandboxes: %d, want 3 lines:\n%s", code, body)
	}
	// Follow: a line written after the stream began arrives.
	fctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	seen := make(chan struct{})
	go func() {
		_ = c.cl.Logs(fctx, "env-verbs", client.LogOptions{Follow: true, Tail: 1}, func(l api.LogLine) error {
			if strings.Contains(l.Text, "Forking") && l.Time.After(time.Now().Add(-5*time.Second)) {
				close(seen)
				return errors.New("done")
			}
			return nil
		})
	}()
	// Calls until one's lines arrive on the stream (the first may come
	// before the stream has started).
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for following := true; following; {
		do("POST", "/function/env-verbs.openfaas-fn", "", "")
		select {
		case <-seen:
			following = false
		case <-fctx.Done():
			t.Fatal("a followed log did not show a new call's lines")
		case <-tick.C:
		}
	}
	// Names are per namespace, as OpenFaaS's: env-verbs again in team-a
	// is another function, listed, described, called (NAME.NAMESPACE) and
	// removed apart from the default namespace's.
	c.mustBrisk(t, "ns", "create", "team-a")
	if code, _, body := do("POST", "/system/functions", basic, `{"service":"env-verbs","image":"brisk.dev/builtin/trace","namespace":"team-a"}`); code/100 != 2 {
		t.Fatalf("deploy env-verbs into team-a: %d %s", code, body)
	}
	if code, _, body := do("GET", "/system/functions?namespace=team-a", basic, ""); code != 200 || !strings.Contains(body, `"name":"env-verbs"`) || !strings.Contains(body, `"namespace":"team-a"`) || strings.Contains(body, "openfaas-fn") {
		t.Fatalf("list team-a: %d %s", code, body)
	}
	if code, _, body := do("GET", "/system/function/env-verbs?namespace=team-a", basic, ""); code != 200 || !strings.Contains(body, `"namespace":"team-a"`) {
		t.Fatalf("describe env-verbs in team-a: %d %s", code, body)
	}
	if code, _, body := do("POST", "/function/env-verbs.team-a", "", `{"ms": 1}`); code != 200 {
		t.Fatalf("invoke env-verbs.team-a: %d %s", code, body)
	}
	if code, _, body := do("DELETE", "/system/functions", basic, `{"functionName":"env-verbs","namespace":"team-a"}`); code/100 != 2 {
		t.Fatalf("remove env-verbs from team-a: %d %s", code, body)
	}
	if code, _, body := do("GET", "/system/function/env-verbs?namespace=openfaas-fn", basic, ""); code != 200 {
		t.Fatalf("the default namespace's env-verbs after team-a's went: %d %s", code, body)
	}
	if code, _, body := do("DELETE", "/system/functions", basic, `{"functionName":"env-test","namespace":"openfaas-fn"}`); code/100 != 2 {
		t.Fatalf("remove: %d %s", code, body)
	}
	if code, _, _ := do("DELETE", "/system/functions", basic, `{"functionName":"env-test"}`); code != 404 {
		t.Fatalf("remove again: %d, want 404", code)
	}
	if code, _, _ := do("GET", "/system/functions", "", ""); code != 401 {
		t.Fatalf("list without credentials: %d, want 401", code)
	}
}
