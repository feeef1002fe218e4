package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/brisk-faas/brisk/pkg/api"
)

// The dashboard at /ui/, in a real browser: headless Chromium (Debian's
// chromium package, which scripts/setup.sh installs) loads the page with
// the token brisk ui puts in its fragment, polls GET /v1/dashboard, and the
// DOM it renders shows the node, the functions (a failing one highlighted),
// the calls and their latency, and the failing function's reason among the
// recent failures. A screenshot is kept as the test's artefact
// ($BRISK_TEST_ARTIFACTS, else a temporary directory; its path is logged).
func TestDashboard(t *testing.T) {
	browser := chromiumPath(t)
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "hello", "--builtin", "trace", "--min", "1", "--wait")
	c.mustBrisk(t, "fn", "deploy", "resize", "--builtin", "trace", "--min", "1", "--wait")
	// A function that cannot start: its starts fail, its condition says so.
	c.mustBrisk(t, "fn", "deploy", "broken", "--command", "/nonexistent/server --flag", "--min", "1")
	c.mustBrisk(t, "trigger", "create", "hourly", "--function", "hello", "--cron", "@hourly")
	for i := range 12 {
		for _, fn := range []string{"hello", "resize"} {
			if inv := c.invoke(t, fn, fmt.Sprintf(`{"ms": %d}`, 2+i)); inv.status != http.StatusOK {
				t.Fatalf("invoke %s: %d %s", fn, inv.status, inv.body)
			}
		}
	}
	// A light load until the browser is done, so that the window the
	// rates and latencies are over (the last 25-30 s) is never empty,
	// however slow the machine.
	stopLoad := keepCalling(c, "hello", "resize")
	defer stopLoad()

	// The endpoint first: the data plane's report (every second) carries
	// the calls and their latencies, the worker the failed starts.
	var d api.Dashboard
	eventually(t, 30*time.Second, "the calls, their latency and broken's failures in GET /v1/dashboard", func() bool {
		d = api.Dashboard{}
		if err := getJSON(c, "/v1/dashboard", &d); err != nil {
			t.Logf("GET /v1/dashboard: %v", err)
			return false
		}
		hello, broken := dashFn(d, "hello"), dashFn(d, "broken")
		return hello != nil && hello.Calls >= 12 && hello.Latency.Count >= 12 && d.Summary.CallsTotal >= 24 &&
			broken != nil && broken.Condition == "function-failing" && failureOf(d, "broken") != nil
	})
	if len(d.Nodes) != 1 || d.Nodes[0].State != "ready" || d.Summary.ColdStartsTotal < 2 {
		t.Fatalf("nodes %+v, cold starts %d", d.Nodes, d.Summary.ColdStartsTotal)
	}
	if d.Summary.Triggers != 1 || len(d.Triggers) != 1 || d.Triggers[0].Name != "hourly" || d.Triggers[0].Status.State != "active" || d.Triggers[0].Status.Next.IsZero() {
		t.Fatalf("triggers %d: %+v", d.Summary.Triggers, d.Triggers)
	}
	node := d.Nodes[0].Name
	if f := failureOf(d, "broken"); !strings.Contains(f.Reason, "/nonexistent/server") {
		t.Fatalf("broken's failure %+v does not name its program", f)
	}
	if h := dashFn(d, "hello"); h.Latency.P50 <= 0 || h.Latency.P99 < h.Latency.P50 || h.ColdStartsPerSecond < 0 {
		t.Fatalf("hello %+v", h)
	}

	// brisk ui prints the page's address with the token in the fragment.
	url := strings.TrimSpace(c.mustBrisk(t, "ui"))
	if tok := adminToken(c.admin); !strings.HasPrefix(url, "http://"+c.admin+"/ui/#token=") || !strings.HasSuffix(url, tok) {
		t.Fatalf("brisk ui printed %q", url)
	}

	dom := runChromium(t, browser, "--dump-dom", url)
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	body := find(doc, func(n *html.Node) bool { return n.Data == "body" })
	if attr(body, "data-state") != "live" {
		t.Fatalf("the page did not render the data (body data-state %q):\n%s", attr(body, "data-state"), tail(string(dom), 3000))
	}
	row := func(table, key, val string) *html.Node {
		tb := byID(doc, table)
		if tb == nil {
			t.Fatalf("no #%s in the page", table)
		}
		return find(tb, func(n *html.Node) bool { return n.Data == "tr" && attr(n, key) == val })
	}
	if r := row("nodes-table", "data-node", node); r == nil || !strings.Contains(text(r), "ready") {
		t.Fatalf("node %s not shown ready in the nodes table:\n%s", node, text(byID(doc, "nodes-table")))
	}
	hello := row("functions-table", "data-function", "hello")
	if hello == nil {
		t.Fatalf("hello not in the functions table:\n%s", text(byID(doc, "functions-table")))
	}
	if n, _ := strconv.Atoi(attr(hello, "data-calls")); n < 12 {
		t.Fatalf("hello's row: %d calls in the window (%q), want >= 12", n, text(hello))
	}
	if b := row("functions-table", "data-function", "broken"); b == nil || attr(b, "data-condition") != "function-failing" ||
		!strings.Contains(attr(b, "class"), "has-condition") || !strings.Contains(text(b), "/nonexistent/server") {
		t.Fatalf("broken not highlighted as function-failing with its cause: %v", b)
	}
	if tr := row("triggers-table", "data-trigger", "default/hourly"); tr == nil || !strings.Contains(text(tr), "cron @hourly") || attr(tr, "data-state") != "active" {
		t.Fatalf("the trigger not in the triggers table:\n%s", text(byID(doc, "triggers-table")))
	}
	calls := tileValue(t, doc, "tile-calls")
	if detail := text(find(byID(doc, "tile-calls"), hasClass("detail"))); calls <= 0 || !strings.Contains(detail, "calls in all") || strings.HasPrefix(detail, "0 ") {
		t.Fatalf("calls tile: %v/s, %q; want calls", calls, detail)
	}
	if p50 := tileValue(t, doc, "tile-p50"); p50 <= 0 {
		t.Fatalf("p50 tile %v, want a latency", p50)
	}
	if n := tileValue(t, doc, "tile-failing"); n < 1 {
		t.Fatalf("failing tile %v, want broken counted", n)
	}
	failures := byID(doc, "failures")
	li := find(failures, func(n *html.Node) bool { return n.Data == "li" && attr(n, "data-function") == "broken" })
	if li == nil || !strings.Contains(text(li), "/nonexistent/server") {
		t.Fatalf("broken's reason not among the recent failures:\n%s", text(failures))
	}
	if pts, _ := strconv.Atoi(attr(byID(doc, "spark-calls"), "data-points")); pts < 1 {
		t.Fatal("no point on the calls sparkline")
	}

	// Without a token the page asks for one, and shows no data.
	dom = runChromium(t, browser, "--dump-dom", "http://"+c.admin+"/ui/")
	doc, err = html.Parse(bytes.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	if body := find(doc, func(n *html.Node) bool { return n.Data == "body" }); attr(body, "data-state") != "token" ||
		hasAttr(byID(doc, "token-panel"), "hidden") || !hasAttr(byID(doc, "dashboard"), "hidden") {
		t.Fatalf("without a token: body data-state %q; want the token form, not the data:\n%s", attr(body, "data-state"), tail(string(dom), 3000))
	}

	// The screenshot, the test's artefact.
	dir := os.Getenv("BRISK_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "dashboard.png")
	runChromium(t, browser, "--screenshot="+shot, url)
	checkScreenshot(t, shot)
	t.Logf("dashboard screenshot: %s", shot)
}

// keepCalling calls the functions, one call at a time, every 50 ms until
// the returned stop is called (and returns once the last call is over).
func keepCalling(c *cluster, fns ...string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.scheme+"://"+c.invokeAddr+"/function/"+fns[i%len(fns)], strings.NewReader(`{"ms": 3}`))
			if resp, err := c.hc.Do(req); err == nil {
				resp.Body.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }
}

// chromiumPath finds Chromium; without it the test fails in CI and is
// skipped elsewhere.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found: scripts/setup.sh --test installs it (apt-get install chromium)")
	}
	t.Skip("chromium not found (apt-get install chromium, or make setup)")
	return ""
}

// runChromium runs headless Chromium on url with action (--dump-dom or
// --screenshot=PATH) and returns its standard output. Virtual time runs the
// page's timers (its polls) without waiting for them in real time; the
// network is real. Chromium runs in a process group of its own, which is
// killed when it overruns and once it has exited (its helpers with it).
func runChromium(t *testing.T, browser, action, url string) []byte {
	t.Helper()
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser,
		"--headless", "--no-sandbox", // as root in CI, Chromium's sandbox cannot start
		"--disable-gpu", "--disable-dev-shm-usage", "--user-data-dir="+filepath.Join(tmp, "profile"),
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
		"--disable-background-networking", "--disable-component-update", "--disable-default-apps",
		"--hide-scrollbars", "--mute-audio", "--window-size=1400,1000",
		"--virtual-time-budget=7000", action, url)
	// Files, not pipes: helpers that outlive the browser cannot hold Wait.
	stdout, err := os.Create(filepath.Join(tmp, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(tmp, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", browser, err)
	}
	err = cmd.Wait()
	if kerr := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
		t.Logf("stopping chromium's helpers: %v", kerr)
	}
	out, _ := os.ReadFile(stdout.Name())
	if err != nil || ctx.Err() != nil {
		log, _ := os.ReadFile(stderr.Name())
		t.Fatalf("chromium %s %s: %v (%v)\n%s", action, url, err, ctx.Err(), tail(string(log), 3000))
	}
	return out
}

// checkScreenshot checks that path is a real picture of the page: a PNG of
// the window's size, not one colour.
func checkScreenshot(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if len(b) < 10_000 {
		t.Fatalf("screenshot %s: %d bytes, too small to show the dashboard", path, len(b))
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot %s: %v", path, err)
	}
	if r := img.Bounds(); r.Dx() != 1400 || r.Dy() != 1000 {
		t.Fatalf("screenshot %s is %dx%d, want 1400x1000", path, r.Dx(), r.Dy())
	}
	colours := map[[4]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 7 {
		for x := r.Min.X; x < r.Max.X; x += 7 {
			cr, cg, cb, ca := img.At(x, y).RGBA()
			colours[[4]uint32{cr, cg, cb, ca}] = true
		}
	}
	if len(colours) < 20 {
		t.Fatalf("screenshot %s has %d colours: not a rendered dashboard", path, len(colours))
	}
}

func getJSON(c *cluster, path string, out any) error {
	resp, err := c.hc.Get(c.scheme + "://" + c.admin + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func dashFn(d api.Dashboard, name string) *api.DashboardFunction {
	for i := range d.Functions {
		if d.Functions[i].Name == name {
			return &d.Functions[i]
		}
	}
	return nil
}

func failureOf(d api.Dashboard, fn string) *api.DashboardFailure {
	for i := range d.Failures {
		if d.Failures[i].Function == fn && d.Failures[i].Kind == "sandbox-failed" {
			return &d.Failures[i]
		}
	}
	return nil
}

// ---------------------------------------------------------------- DOM

// find returns the first node under n (n included) that match accepts.
func find(n *html.Node, match func(*html.Node) bool) *html.Node {
	if n == nil {
		return nil
	}
	if n.Type == html.ElementNode && match(n) {
		return n
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if m := find(c, match); m != nil {
			return m
		}
	}
	return nil
}

func byID(doc *html.Node, id string) *html.Node {
	return find(doc, func(n *html.Node) bool { return attr(n, "id") == id })
}

func hasClass(class string) func(*html.Node) bool {
	return func(n *html.Node) bool { return strings.Contains(" "+attr(n, "class")+" ", " "+class+" ") }
}

func attr(n *html.Node, key string) string {
	if n == nil {
		return ""
	}
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func hasAttr(n *html.Node, key string) bool {
	if n == nil {
		return false
	}
	for _, a := range n.Attr {
		if a.Key == key {
			return true
		}
	}
	return false
}

// text is n's text, its elements' separated by spaces.
func text(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n == nil {
			return
		}
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
			b.WriteByte(' ')
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return strings.Join(strings.Fields(b.String()), " ")
}

// tileValue is the number a summary tile shows (its data-value).
func tileValue(t *testing.T, doc *html.Node, id string) float64 {
	t.Helper()
	v := find(byID(doc, id), hasClass("value"))
	f, err := strconv.ParseFloat(attr(v, "data-value"), 64)
	if err != nil {
		t.Fatalf("tile %s: value %q: %v", id, attr(v, "data-value"), err)
	}
	return f
}
