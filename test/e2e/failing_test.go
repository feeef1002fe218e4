package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A function that can never start is known for what it is: fn deploy
// --wait fails with the cause, calls get a 503 with it (not a queue
// timeout), fn list and the metrics show it; fixed, it serves.
func TestFailingFunctionFailsFast(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	out, code := c.brisk(t, "fn", "deploy", "broken", "--command", "/nonexistent/server --flag", "--min", "1", "--public", "--wait")
	if code == 0 || !strings.Contains(out, "cannot start") || !strings.Contains(out, "/nonexistent/server") {
		t.Fatalf("fn deploy --wait of a function that cannot start: exit %d\n%s", code, out)
	}
	call := func(name string) (int, string, string) {
		resp, err := c.hc.Post(c.scheme+"://"+c.invokeAddr+"/function/"+name, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("X-Brisk-Error"), string(b)
	}
	if st, why, body := call("broken"); st != http.StatusServiceUnavailable || why != "function-failing" || !strings.Contains(body, "/nonexistent/server") {
		t.Fatalf("call of a failing function: %d %q %s, want 503 function-failing naming the program", st, why, body)
	}
	// Scale from zero: the first call waits only until the starts have
	// failed often enough, then gets the cause.
	c.mustBrisk(t, "fn", "deploy", "broken0", "--command", "/nonexistent/other", "--public")
	if st, why, body := call("broken0"); st != http.StatusServiceUnavailable || why != "function-failing" || !strings.Contains(body, "/nonexistent/other") {
		t.Fatalf("first call of a failing function: %d %q %s, want 503 function-failing", st, why, body)
	}
	if out := c.mustBrisk(t, "fn", "list"); !strings.Contains(out, "function-failing") {
		t.Fatalf("fn list does not show the failing functions:\n%s", out)
	}
	if out, code := c.brisk(t, "invoke", "broken", "-v"); code == 0 || !strings.Contains(out, "function-failing") || strings.Contains(out, "start: warm") {
		t.Fatalf("invoke -v of a failing function: exit %d\n%s", code, out)
	}
	resp, err := c.hc.Get("http://" + c.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `brisk_function_condition{condition="function-failing",function="broken"} 1`) {
		t.Fatalf("no brisk_function_condition gauge for broken")
	}

	// Fixed: a new revision serves, and --wait says so.
	if out := c.mustBrisk(t, "fn", "deploy", "broken", "--builtin", "trace", "--min", "1", "--wait"); !strings.Contains(out, "is serving") {
		t.Fatalf("fn deploy --wait of a working revision:\n%s", out)
	}
	if st, why, body := call("broken"); st != 200 {
		t.Fatalf("the fixed function: %d %q %s", st, why, body)
	}
	if out := c.mustBrisk(t, "fn", "deploy", "lazy", "--builtin", "trace", "--wait"); !strings.Contains(out, "no sandbox starts before the first call") {
		t.Fatalf("fn deploy --wait with min 0:\n%s", out)
	}
}
