package lang

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The runners' tests start python/runner.py and node/runner.js under the
// host's interpreters, on example functions written to a temporary
// directory, and talk HTTP to them.

type runnerLang struct {
	name   string
	interp string
	args   []string
}

var (
	pythonLang = runnerLang{"python", DefaultPython, []string{"-B", "-s", "./python/runner.py"}}
	nodeLang   = runnerLang{"node", "/usr/bin/node", []string{"./node/runner.js"}}
	bothLangs  = []runnerLang{pythonLang, nodeLang}
)

// need skips the test when the host lacks l's interpreter.
func (l runnerLang) need(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(l.interp); err != nil {
		t.Skipf("no %s interpreter: %v", l.name, err)
	}
}

// runnerOutput collects a process's output.
type runnerOutput struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *runnerOutput) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *runnerOutput) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runnerProc is a started runner.
type runnerProc struct {
	dir       string // the function's code
	addr      string // host:port it listens on
	cmd       *exec.Cmd
	stdout    *runnerOutput
	stderr    *runnerOutput
	done      chan struct{} // closed when the process has exited (and its output is in)
	listening bool          // it accepted a connection before exiting
	client    *http.Client  // a client of its own (its own connections)
}

// writeFunctionCode writes files (path: content) into a new temporary directory.
func writeFunctionCode(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// freeTCPPort is a TCP port nothing listens on (for a moment).
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// startRunner writes files, starts l's runner on them with env (BRISK_*
// variables; PORT and BRISK_CODE_DIR are set, BRISK_LISTEN_HOST is
// 127.0.0.1 unless env names one) and returns once it accepts a TCP
// connection or has exited.
func startRunner(t *testing.T, l runnerLang, files map[string]string, env map[string]string) *runnerProc {
	t.Helper()
	l.need(t)
	dir := writeFunctionCode(t, files)
	port := freeTCPPort(t)
	host := "127.0.0.1"
	if h, ok := env["BRISK_LISTEN_HOST"]; ok {
		host = h
	}
	r := &runnerProc{
		dir:    dir,
		addr:   net.JoinHostPort(host, strconv.Itoa(port)),
		stdout: &runnerOutput{},
		stderr: &runnerOutput{},
		done:   make(chan struct{}),
	}
	r.cmd = exec.CommandContext(t.Context(), l.interp, l.args...)
	r.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"PORT=" + strconv.Itoa(port),
		"BRISK_LISTEN_HOST=" + host,
		"BRISK_CODE_DIR=" + dir,
	}
	for k, v := range env {
		if k != "BRISK_LISTEN_HOST" {
			r.cmd.Env = append(r.cmd.Env, k+"="+v)
		}
	}
	r.cmd.Stdout, r.cmd.Stderr = r.stdout, r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("starting the %s runner: %v", l.name, err)
	}
	go func() {
		r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(r.stop)
	r.client = &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	t.Cleanup(r.client.CloseIdleConnections)

	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(3 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			return r
		default:
		}
		if c, err := net.DialTimeout("tcp", r.addr, time.Second); err == nil {
			c.Close()
			r.listening = true
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %s runner neither listened on %s nor exited in 20s; stderr:\n%s", l.name, r.addr, r.stderr.String())
		}
		select {
		case <-r.done:
			return r
		case <-tick.C:
		}
	}
}

// stop kills the runner (by its PID) and waits until it has exited and its
// output is collected.
func (r *runnerProc) stop() {
	if r.cmd.Process != nil {
		r.cmd.Process.Kill()
	}
	<-r.done
}

// mustListen fails the test unless the runner is serving.
func (r *runnerProc) mustListen(t *testing.T) {
	t.Helper()
	if !r.listening {
		t.Fatalf("the runner exited (%v) without listening; stderr:\n%s", r.cmd.ProcessState, r.stderr.String())
	}
}

// do sends one request and returns the reply and its body.
func (r *runnerProc) do(t *testing.T, method, path string, header map[string]string, body string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+r.addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v; stderr:\n%s", method, path, err, r.stderr.String())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return resp, b
}

// runnerCall is one request and the reply it must get.
type runnerCall struct {
	name   string
	method string // POST when empty
	path   string // / when empty
	header map[string]string
	body   string

	status int
	// wantHeader is all the reply's header fields but Date, Connection and
	// Keep-Alive; when nil, they are Content-Type: wantType and the
	// body's Content-Length.
	wantHeader map[string]string
	wantType   string
	wantBody   string // exactly, unless check is set
	check      func(t *testing.T, r *runnerProc, body []byte)
}

// runnerHopHeaders are left out of the comparison of header fields: the Node
// runner's http module adds them.
var runnerHopHeaders = []string{"Date", "Connection", "Keep-Alive"}

func (c runnerCall) run(t *testing.T, r *runnerProc) {
	t.Helper()
	method, path := c.method, c.path
	if method == "" {
		method = "POST"
	}
	if path == "" {
		path = "/"
	}
	resp, body := r.do(t, method, path, c.header, c.body)
	if resp.StatusCode != c.status {
		t.Errorf("status %d, want %d; body %q", resp.StatusCode, c.status, body)
	}
	got := map[string]string{}
	for k, v := range resp.Header {
		skip := false
		for _, h := range runnerHopHeaders {
			skip = skip || k == h
		}
		if !skip {
			got[k] = strings.Join(v, ", ")
		}
	}
	want := c.wantHeader
	if want == nil {
		want = map[string]string{"Content-Type": c.wantType, "Content-Length": strconv.Itoa(len(body))}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("header fields %v, want %v", got, want)
	}
	if c.check != nil {
		c.check(t, r, body)
	} else if string(body) != c.wantBody {
		t.Errorf("body\n%s\nwant\n%s", body, c.wantBody)
	}
}

func jsonReplyHeader(body string) map[string]string {
	return map[string]string{"Content-Type": "application/json", "Content-Length": strconv.Itoa(len(body))}
}

func textReplyHeader(body string) map[string]string {
	return map[string]string{"Content-Type": "text/plain; charset=utf-8", "Content-Length": strconv.Itoa(len(body))}
}

// decodeJSON decodes body into a map, failing the test if it is not one.
func decodeJSONObject(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return m
}

var requestIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// ---------------------------------------------------------------- lambda

const pyLambda = `import os
import time


def handler(event, context):
    print("called", context.aws_request_id)
    op = event.get("op") if isinstance(event, dict) else None
    if op == "raise":
        raise ValueError("bad input")
    if op == "set":
        return {1, 2}
    if op == "none":
        return None
    if op == "id":
        return context.aws_request_id
    if op == "meet":
        # Waits until the other call has started (its file exists), then
        # says it has: both calls must be running at once.
        open(os.path.join(event["dir"], event["me"]), "w").close()
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(event["dir"], event["other"])):
            if time.monotonic() > deadline:
                return "alone"
            time.sleep(0.002)
        return "met"
    cc = context.client_context
    return {
        "event": event,
        "function_name": context.function_name,
        "function_version": context.function_version,
        "invoked_function_arn": context.invoked_function_arn,
        "memory_limit_in_mb": context.memory_limit_in_mb,
        "aws_request_id": context.aws_request_id,
        "log_group_name": context.log_group_name,
        "remaining_ok": 0 < context.get_remaining_time_in_millis() <= 5000,
        "identity": context.identity,
        "client_context": None if cc is None else cc.custom,
    }
`

const jsLambda = `const fs = require('fs');
const path = require('path');

exports.handler = async (event, context) => {
  console.log('called', context.awsRequestId);
  const op = event && typeof event === 'object' ? event.op : undefined;
  if (op === 'raise') throw new TypeError('bad input');
  if (op === 'reject') return Promise.reject('plain string');
  if (op === 'bigint') return { n: 1n };
  if (op === 'undefined') throw undefined;
  if (op === 'legacy') {
    context.succeed({ legacy: true });
    return;
  }
  if (op === 'none') return undefined;
  if (op === 'id') return context.awsRequestId;
  if (op === 'meet') {
    fs.writeFileSync(path.join(event.dir, event.me), '');
    const deadline = Date.now() + 10000;
    while (!fs.existsSync(path.join(event.dir, event.other))) {
      if (Date.now() > deadline) return 'alone';
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
    return 'met';
  }
  const r = context.getRemainingTimeInMillis();
  return {
    event,
    functionName: context.functionName,
    functionVersion: context.functionVersion,
    invokedFunctionArn: context.invokedFunctionArn,
    memoryLimitInMB: context.memoryLimitInMB,
    awsRequestId: context.awsRequestId,
    logGroupName: context.logGroupName,
    remainingOk: r > 0 && r <= 5000,
    clientContext: context.clientContext === undefined ? null : context.clientContext,
  };
};
`

func lambdaEnv(handler string) map[string]string {
	return map[string]string{
		"BRISK_HANDLER":    handler,
		"BRISK_CONTRACT":   "lambda",
		"BRISK_FUNCTION":   "echo-fn",
		"BRISK_TIMEOUT_MS": "5000",
		"BRISK_MEMORY_MB":  "256",
	}
}

func startLambda(t *testing.T, l runnerLang) *runnerProc {
	t.Helper()
	files := map[string]string{"app.py": pyLambda}
	handler := "app.handler"
	if l.name == "node" {
		files = map[string]string{"index.js": jsLambda}
		handler = "index.handler"
	}
	r := startRunner(t, l, files, lambdaEnv(handler))
	r.mustListen(t)
	return r
}

func TestRunnerLambda(t *testing.T) {
	clientContext := base64.StdEncoding.EncodeToString([]byte(`{"custom":{"k":"v"}}`))
	py := []runnerCall{
		{
			name:   "echo",
			header: map[string]string{"X-Call-Id": "call-1", "X-Request-Id": "req-1", "Content-Type": "application/json"},
			body:   `{"a": 1, "b": [true, null, "x"]}`,
			status: 200,
			wantBody: `{"event": {"a": 1, "b": [true, null, "x"]}, "function_name": "echo-fn", "function_version": "$LATEST", ` +
				`"invoked_function_arn": "arn:aws:lambda:brisk:000000000000:function:echo-fn", "memory_limit_in_mb": 256, ` +
				`"aws_request_id": "call-1", "log_group_name": "/aws/lambda/echo-fn", "remaining_ok": true, "identity": null, "client_context": null}`,
		},
		{
			name:   "empty body, X-Request-Id, client context",
			method: "GET",
			path:   "/any/path?q=1",
			header: map[string]string{"X-Request-Id": "req-2", "X-Amz-Client-Context": clientContext},
			status: 200,
			wantBody: `{"event": {}, "function_name": "echo-fn", "function_version": "$LATEST", ` +
				`"invoked_function_arn": "arn:aws:lambda:brisk:000000000000:function:echo-fn", "memory_limit_in_mb": 256, ` +
				`"aws_request_id": "req-2", "log_group_name": "/aws/lambda/echo-fn", "remaining_ok": true, "identity": null, "client_context": {"k": "v"}}`,
		},
		{
			name:   "a request id of its own",
			body:   `{"op": "id"}`,
			status: 200,
			check:  checkUUIDBody,
		},
		{
			name:     "not JSON",
			body:     `{"a": `,
			status:   400,
			wantBody: `{"errorType": "InvalidRequestContentException", "errorMessage": "Could not parse request body into json: Expecting value: line 1 column 7 (char 6)"}`,
		},
		{
			name:     "None",
			body:     `{"op": "none"}`,
			status:   200,
			wantBody: `null`,
		},
		{
			name:   "exception",
			header: map[string]string{"X-Call-Id": "call-3"},
			body:   `{"op": "raise"}`,
			status: 500,
			check: func(t *testing.T, r *runnerProc, body []byte) {
				m := decodeJSONObject(t, body)
				want := fmt.Sprintf("  File %q, line 9, in handler\n    raise ValueError(\"bad input\")\n", filepath.Join(r.dir, "app.py"))
				trace, _ := m["stackTrace"].([]any)
				if m["errorType"] != "ValueError" || m["errorMessage"] != "bad input" || m["requestId"] != "call-3" ||
					len(trace) != 1 || trace[0] != want || len(m) != 4 {
					t.Errorf("error %s, want ValueError, bad input, call-3 and the stack trace %q", body, want)
				}
			},
		},
		{
			name:     "result not JSON",
			header:   map[string]string{"X-Call-Id": "call-4"},
			body:     `{"op": "set"}`,
			status:   500,
			wantBody: `{"errorMessage": "Unable to marshal response: Object of type set is not JSON serializable", "errorType": "Runtime.MarshalError", "requestId": "call-4", "stackTrace": []}`,
		},
	}
	js := []runnerCall{
		{
			name:   "echo",
			header: map[string]string{"X-Call-Id": "call-1", "X-Request-Id": "req-1", "Content-Type": "application/json"},
			body:   `{"a": 1, "b": [true, null, "x"]}`,
			status: 200,
			wantBody: `{"event":{"a":1,"b":[true,null,"x"]},"functionName":"echo-fn","functionVersion":"$LATEST",` +
				`"invokedFunctionArn":"arn:aws:lambda:brisk:000000000000:function:echo-fn","memoryLimitInMB":"256",` +
				`"awsRequestId":"call-1","logGroupName":"/aws/lambda/echo-fn","remainingOk":true,"clientContext":null}`,
		},
		{
			name:   "empty body, X-Request-Id, client context",
			method: "GET",
			path:   "/any/path?q=1",
			header: map[string]string{"X-Request-Id": "req-2", "X-Amz-Client-Context": clientContext},
			status: 200,
			wantBody: `{"event":{},"functionName":"echo-fn","functionVersion":"$LATEST",` +
				`"invokedFunctionArn":"arn:aws:lambda:brisk:000000000000:function:echo-fn","memoryLimitInMB":"256",` +
				`"awsRequestId":"req-2","logGroupName":"/aws/lambda/echo-fn","remainingOk":true,"clientContext":{"custom":{"k":"v"}}}`,
		},
		{
			name:   "a request id of its own",
			body:   `{"op": "id"}`,
			status: 200,
			check:  checkUUIDBody,
		},
		{
			name:     "not JSON",
			body:     `{"a": `,
			status:   400,
			wantBody: `{"errorType":"InvalidRequestContentException","errorMessage":"Could not parse request body into json: Unexpected end of JSON input"}`,
		},
		{
			name:     "undefined",
			body:     `{"op": "none"}`,
			status:   200,
			wantBody: `null`,
		},
		{
			name:   "exception",
			header: map[string]string{"X-Call-Id": "call-3"},
			body:   `{"op": "raise"}`,
			status: 500,
			check: func(t *testing.T, r *runnerProc, body []byte) {
				m := decodeJSONObject(t, body)
				trace, _ := m["trace"].([]any)
				at := "(" + filepath.Join(r.dir, "index.js") + ":7:"
				if m["errorType"] != "TypeError" || m["errorMessage"] != "bad input" || len(m) != 3 ||
					len(trace) < 2 || trace[0] != "TypeError: bad input" || !strings.Contains(fmt.Sprint(trace[1]), at) {
					t.Errorf("error %s, want TypeError, bad input and a trace through %s", body, at)
				}
			},
		},
		{
			name:     "rejected with a string",
			body:     `{"op": "reject"}`,
			status:   500,
			wantBody: `{"errorType":"string","errorMessage":"plain string","trace":[]}`,
		},
		{
			name:     "undefined thrown",
			body:     `{"op": "undefined"}`,
			status:   500,
			wantBody: `{"errorType":"undefined","errorMessage":"undefined","trace":[]}`,
		},
		{
			name:     "context.succeed",
			body:     `{"op": "legacy"}`,
			status:   200,
			wantBody: `{"legacy":true}`,
		},
		{
			name:     "result not JSON",
			body:     `{"op": "bigint"}`,
			status:   500,
			wantBody: `{"errorType":"Runtime.MarshalError","errorMessage":"Unable to marshal response: Do not know how to serialize a BigInt","trace":[]}`,
		},
	}
	for _, l := range bothLangs {
		t.Run(l.name, func(t *testing.T) {
			r := startLambda(t, l)
			calls := py
			if l.name == "node" {
				calls = js
			}
			for _, c := range calls {
				c.wantType = "application/json"
				t.Run(c.name, func(t *testing.T) { c.run(t, r) })
			}
			// The function's output and the errors are its log.
			r.stop()
			out, errs := r.stdout.String(), r.stderr.String()
			for _, id := range []string{"call-1", "req-2", "call-3"} {
				if !strings.Contains(out, "called "+id+"\n") {
					t.Errorf("stdout lacks the handler's line for %s:\n%s", id, out)
				}
			}
			wantErr := "[ERROR] ValueError: bad input\nTraceback (most recent call last):\n"
			if l.name == "node" {
				wantErr = "call-3\tERROR\tInvoke Error \t{\"errorType\":\"TypeError\",\"errorMessage\":\"bad input\""
			}
			if !strings.Contains(errs, wantErr) {
				t.Errorf("stderr lacks %q:\n%s", wantErr, errs)
			}
		})
	}
}

func checkUUIDBody(t *testing.T, r *runnerProc, body []byte) {
	var id string
	if err := json.Unmarshal(body, &id); err != nil || !requestIDRE.MatchString(id) {
		t.Errorf("request id %s, want a random UUID", body)
	}
}

// TestRunnerModules: how a handler names its module.
func TestRunnerModules(t *testing.T) {
	cases := []struct {
		lang    runnerLang
		name    string
		files   map[string]string
		handler string
		body    string
		want    string
	}{
		{
			lang: pythonLang, name: "dotted module",
			files: map[string]string{
				"pkg/__init__.py": "",
				"pkg/mod.py":      "def fn(event, context):\n    return {'in': __name__, 'event': event}\n",
			},
			handler: "pkg.mod.fn", body: `{"x": 1}`, want: `{"in": "pkg.mod", "event": {"x": 1}}`,
		},
		{
			lang: pythonLang, name: "module importing its neighbours",
			files: map[string]string{
				"lambda_function.py": "import helper\n\ndef lambda_handler(event, context):\n    return helper.twice(event['n'])\n",
				"helper.py":          "def twice(n):\n    return 2 * n\n",
			},
			handler: "lambda_function.lambda_handler", body: `{"n": 21}`, want: `42`,
		},
		{
			lang: nodeLang, name: "callback",
			files: map[string]string{
				"index.js": "exports.handler = function (event, context, callback) {\n" +
					"  setImmediate(() => event.fail ? callback(new Error('callback failed')) : callback(null, { viaCallback: event.x }));\n};\n",
			},
			handler: "index.handler", body: `{"x": 7}`, want: `{"viaCallback":7}`,
		},
		{
			lang: nodeLang, name: "ES module",
			files: map[string]string{
				"index.mjs": "export const handler = async (event, context) => ({ esm: true, fn: context.functionName, event });\n",
			},
			handler: "index.handler", body: `{"x": 1}`, want: `{"esm":true,"fn":"echo-fn","event":{"x":1}}`,
		},
		{
			lang: nodeLang, name: "ES module package",
			files: map[string]string{
				"package.json": `{"type": "module"}`,
				"index.js":     "export async function handler(event) { return { esm: import.meta.url.endsWith('/index.js') }; }\n",
			},
			handler: "index.handler", body: ``, want: `{"esm":true}`,
		},
		{
			lang: nodeLang, name: "dotted module",
			files: map[string]string{
				"a/b.js": "exports.fn = (event) => ({ in: 'a/b', event });\n",
			},
			handler: "a.b.fn", body: `[1]`, want: `{"in":"a/b","event":[1]}`,
		},
		{
			lang: nodeLang, name: "directory module",
			files: map[string]string{
				"lib/index.js": "exports.handler = async () => 'lib/index.js';\n",
			},
			handler: "lib.handler", body: ``, want: `"lib/index.js"`,
		},
		{
			lang: nodeLang, name: "module.exports",
			files: map[string]string{
				"handler.js": "module.exports = async (event) => ({ whole: true });\n",
			},
			handler: "handler", body: ``, want: `{"whole":true}`,
		},
	}
	for _, c := range cases {
		t.Run(c.lang.name+"/"+c.name, func(t *testing.T) {
			r := startRunner(t, c.lang, c.files, lambdaEnv(c.handler))
			r.mustListen(t)
			runnerCall{body: c.body, status: 200, wantHeader: jsonReplyHeader(c.want), wantBody: c.want}.run(t, r)
			if c.name == "callback" {
				body := `{"errorType":"Error","errorMessage":"callback failed"`
				resp, b := r.do(t, "POST", "/", nil, `{"fail": true}`)
				if resp.StatusCode != 500 || !strings.HasPrefix(string(b), body) {
					t.Errorf("failing callback: %d %s, want 500 %s...", resp.StatusCode, b, body)
				}
			}
		})
	}
}

// ---------------------------------------------------------------- http

const pyHTTP = `def handle(event, context):
    p = event.path
    if p == "/created":
        return {"statusCode": 201, "headers": {"X-Thing": "yes"}, "body": "made"}
    if p == "/json":
        return {"statusCode": 202, "body": {"ok": True}}
    if p == "/text":
        return "hello"
    if p == "/bytes":
        return b"\x00\x01"
    if p == "/none":
        return None
    if p == "/list":
        return [1, "two"]
    if p == "/boom":
        raise RuntimeError("kaput")
    print("handled", event.method, event.path)
    return {
        "statusCode": 200,
        "body": {
            "method": event.method,
            "path": event.path,
            "query": event.query,
            "body": event.body.decode(),
            "content_type": event.headers.get("content-type"),
            "x_call_id": event.headers["X-Call-Id"],
            "function_name": context.function_name,
            "request_id": context.request_id,
            "remaining_ok": 0 < context.get_remaining_time_in_millis() <= 5000,
        },
    }
`

const jsHTTP = `module.exports = async (event, context) => {
  switch (event.path) {
    case '/created':
      return { statusCode: 201, headers: { 'X-Thing': 'yes' }, body: 'made' };
    case '/json':
      return { statusCode: 202, body: { ok: true } };
    case '/text':
      return 'hello';
    case '/bytes':
      return Buffer.from([0, 1]);
    case '/ctx':
      context.status(202).headers({ 'X-Ctx': '1' }).succeed('ok');
      return;
    case '/ctx-return':
      return context.status(203).succeed({ via: 'context' });
    case '/none':
      return undefined;
    case '/list':
      return [1, 'two'];
    case '/boom':
      throw new Error('kaput');
    case '/fail':
      context.fail(new Error('failed'));
      return;
  }
  console.log('handled', event.method, event.path);
  const r = context.getRemainingTimeInMillis();
  return {
    method: event.method,
    path: event.path,
    query: event.query,
    body: event.body,
    rawBody: event.rawBody.toString(),
    contentType: event.headers['content-type'],
    functionName: context.functionName,
    requestId: context.requestId,
    remainingOk: r > 0 && r <= 5000,
  };
};
`

func TestRunnerHTTP(t *testing.T) {
	shared := func(l runnerLang) []runnerCall {
		list, ok := `[1, "two"]`, `{"ok": true}`
		if l.name == "node" {
			list, ok = `[1,"two"]`, `{"ok":true}`
		}
		return []runnerCall{
			{name: "status, header, body", path: "/created", status: 201, wantBody: "made",
				wantHeader: map[string]string{"X-Thing": "yes", "Content-Type": "text/plain; charset=utf-8", "Content-Length": "4"}},
			{name: "JSON body", path: "/json", status: 202, wantBody: ok, wantHeader: jsonReplyHeader(ok)},
			{name: "string", method: "GET", path: "/text", status: 200, wantBody: "hello", wantHeader: textReplyHeader("hello")},
			{name: "bytes", method: "GET", path: "/bytes", status: 200, wantBody: "\x00\x01",
				wantHeader: map[string]string{"Content-Type": "application/octet-stream", "Content-Length": "2"}},
			{name: "list", method: "GET", path: "/list", status: 200, wantBody: list, wantHeader: jsonReplyHeader(list)},
		}
	}
	py := append(shared(pythonLang),
		runnerCall{name: "None", method: "GET", path: "/none", status: 204, wantBody: "", wantHeader: map[string]string{}},
		runnerCall{name: "exception", method: "GET", path: "/boom", status: 500, wantBody: "RuntimeError: kaput\n", wantHeader: textReplyHeader("RuntimeError: kaput\n")},
		runnerCall{
			name: "request", method: "PUT", path: "/some/where?a=1&b=x+y%21&a=2&empty=",
			header: map[string]string{"Content-Type": "text/plain", "X-Call-Id": "call-9"}, body: "hi there", status: 200, wantType: "application/json",
			wantBody: `{"method": "PUT", "path": "/some/where", "query": {"a": "1", "b": "x y!", "empty": ""}, "body": "hi there", ` +
				`"content_type": "text/plain", "x_call_id": "call-9", "function_name": "http-fn", "request_id": "call-9", "remaining_ok": true}`,
		},
	)
	js := append(shared(nodeLang),
		runnerCall{name: "context.status and succeed", method: "GET", path: "/ctx", status: 202, wantBody: "ok",
			wantHeader: map[string]string{"X-Ctx": "1", "Content-Type": "text/plain; charset=utf-8", "Content-Length": "2"}},
		runnerCall{name: "context returned", method: "GET", path: "/ctx-return", status: 203, wantBody: `{"via":"context"}`, wantHeader: jsonReplyHeader(`{"via":"context"}`)},
		runnerCall{name: "undefined", method: "GET", path: "/none", status: 200, wantBody: "", wantHeader: map[string]string{"Content-Length": "0"}},
		runnerCall{name: "exception", method: "GET", path: "/boom", status: 500, wantBody: "Error: kaput\n", wantHeader: textReplyHeader("Error: kaput\n")},
		runnerCall{name: "context.fail", method: "GET", path: "/fail", status: 500, wantBody: "Error: failed\n", wantHeader: textReplyHeader("Error: failed\n")},
		runnerCall{
			name: "request", method: "PUT", path: "/some/where?a=1&b=x+y%21&a=2&empty=",
			header: map[string]string{"Content-Type": "application/json", "X-Call-Id": "call-9"}, body: `{"k": [1]}`, status: 200, wantType: "application/json",
			wantBody: `{"method":"PUT","path":"/some/where","query":{"a":["1","2"],"b":"x y!","empty":""},"body":{"k":[1]},"rawBody":"{\"k\": [1]}",` +
				`"contentType":"application/json","functionName":"http-fn","requestId":"call-9","remainingOk":true}`,
		},
		runnerCall{
			name: "text request", method: "POST", path: "/t",
			header: map[string]string{"Content-Type": "text/plain", "X-Call-Id": "call-10"}, body: `{"k": [1]}`, status: 200, wantType: "application/json",
			wantBody: `{"method":"POST","path":"/t","query":{},"body":"{\"k\": [1]}","rawBody":"{\"k\": [1]}",` +
				`"contentType":"text/plain","functionName":"http-fn","requestId":"call-10","remainingOk":true}`,
		},
	)
	for _, l := range bothLangs {
		t.Run(l.name, func(t *testing.T) {
			files, handler, calls := map[string]string{"handler.py": pyHTTP}, "handler.handle", py
			if l.name == "node" {
				files, handler, calls = map[string]string{"handler.js": jsHTTP}, "handler", js
			}
			r := startRunner(t, l, files, map[string]string{
				"BRISK_HANDLER":    handler,
				"BRISK_CONTRACT":   "http",
				"BRISK_FUNCTION":   "http-fn",
				"BRISK_TIMEOUT_MS": "5000",
			})
			r.mustListen(t)
			for _, c := range calls {
				t.Run(c.name, func(t *testing.T) { c.run(t, r) })
			}
			r.stop()
			want := "handled PUT /some/where\n"
			if !strings.Contains(r.stdout.String(), want) {
				t.Errorf("stdout lacks %q:\n%s", want, r.stdout.String())
			}
			trace := "RuntimeError: kaput\n"
			if l.name == "node" {
				trace = "Error: kaput\n    at "
			}
			if !strings.Contains(r.stderr.String(), trace) {
				t.Errorf("stderr lacks the traceback %q:\n%s", trace, r.stderr.String())
			}
		})
	}
}

// ---------------------------------------------------------------- loading

func TestRunnerLoadFailure(t *testing.T) {
	cases := []struct {
		lang    runnerLang
		name    string
		files   map[string]string
		handler string
		want    string // the last line of stderr starts with this
	}{
		{pythonLang, "syntax error", map[string]string{"app.py": "def handler(event, context)\n    return 1\n"}, "app.handler",
			"brisk: cannot load handler app.handler: SyntaxError: "},
		{pythonLang, "missing module", map[string]string{"other.py": ""}, "app.handler",
			"brisk: cannot load handler app.handler: ModuleNotFoundError: No module named 'app'"},
		{pythonLang, "missing dependency", map[string]string{"app.py": "import not_installed\n"}, "app.handler",
			"brisk: cannot load handler app.handler: ModuleNotFoundError: No module named 'not_installed'"},
		{pythonLang, "missing function", map[string]string{"app.py": "x = 1\n"}, "app.handler",
			"brisk: cannot load handler app.handler: AttributeError: module 'app' has no attribute 'handler'"},
		{pythonLang, "not callable", map[string]string{"app.py": "handler = 1\n"}, "app.handler",
			"brisk: cannot load handler app.handler: TypeError: app.handler is not callable (int)"},
		{pythonLang, "exception at import", map[string]string{"app.py": "raise RuntimeError('no config')\n"}, "app.handler",
			"brisk: cannot load handler app.handler: RuntimeError: no config"},
		{pythonLang, "no function named", map[string]string{"app.py": ""}, "app",
			`brisk: cannot load handler app: ValueError: handler "app" is not MODULE.FUNCTION`},
		{nodeLang, "syntax error", map[string]string{"index.js": "exports.handler = async (event) => {\n  return }}\n"}, "index.handler",
			"brisk: cannot load handler index.handler: SyntaxError: Unexpected token '}'"},
		{nodeLang, "ES module syntax error", map[string]string{"index.mjs": "export const handler = (;\n"}, "index.handler",
			"brisk: cannot load handler index.handler: SyntaxError: "},
		{nodeLang, "missing module", map[string]string{"other.js": ""}, "index.handler",
			"brisk: cannot load handler index.handler: Error: Cannot find module 'index'"},
		{nodeLang, "missing dependency", map[string]string{"index.js": "require('not-installed');\n"}, "index.handler",
			"brisk: cannot load handler index.handler: Error: Cannot find module 'not-installed'"},
		{nodeLang, "missing export", map[string]string{"index.js": "exports.other = () => 1;\n"}, "index.handler",
			`brisk: cannot load handler index.handler: index.js has no export "handler"`},
		{nodeLang, "not a function", map[string]string{"index.js": "exports.handler = 1;\n"}, "index.handler",
			`brisk: cannot load handler index.handler: index.js's export "handler" is not a function (number)`},
		{nodeLang, "module not a function", map[string]string{"handler.js": "exports.x = 1;\n"}, "handler",
			`brisk: cannot load handler handler: handler.js's module.exports is not a function (object)`},
		{nodeLang, "exception at load", map[string]string{"index.js": "throw new Error('no config');\n"}, "index.handler",
			"brisk: cannot load handler index.handler: Error: no config"},
	}
	for _, c := range cases {
		t.Run(c.lang.name+"/"+c.name, func(t *testing.T) {
			r := startRunner(t, c.lang, c.files, lambdaEnv(c.handler))
			if r.listening {
				t.Fatalf("it listened")
			}
			<-r.done
			if code := r.cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			errs := strings.TrimRight(r.stderr.String(), "\n")
			last := errs[strings.LastIndexByte(errs, '\n')+1:]
			if !strings.HasPrefix(last, c.want) {
				t.Errorf("last line of stderr\n%s\nwant it to start with\n%s\nstderr:\n%s", last, c.want, errs)
			}
			if c.name == "syntax error" && !strings.Contains(errs, "SyntaxError") {
				t.Errorf("stderr does not show the syntax error:\n%s", errs)
			}
		})
	}
}

// ---------------------------------------------------------------- wire

// rawConn is a connection the test writes requests on by hand.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRunner(t *testing.T, r *runnerProc) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// roundTrip writes raw and reads the reply to it.
func (rc *rawConn) roundTrip(raw, method string) (*http.Response, []byte) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, raw); err != nil {
		rc.t.Fatal(err)
	}
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("reading the reply: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("reading the reply's body: %v", err)
	}
	return resp, b
}

// closed checks that the runner closes the connection.
func (rc *rawConn) closed() {
	rc.t.Helper()
	if b, err := rc.br.ReadByte(); err != io.EOF {
		rc.t.Errorf("the connection was not closed: read %q, %v", b, err)
	}
}

// echoedEvent decodes the event the echo handler returns.
func echoedEvent(t *testing.T, body []byte) string {
	t.Helper()
	var m struct {
		Event json.RawMessage `json:"event"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return string(m.Event)
}

func TestRunnerWire(t *testing.T) {
	for _, l := range bothLangs {
		t.Run(l.name, func(t *testing.T) {
			r := startLambda(t, l)
			compact := func(s string) string {
				if l.name == "python" {
					return s
				}
				var b bytes.Buffer
				json.Compact(&b, []byte(s))
				return b.String()
			}

			t.Run("keep-alive, chunked, Connection: close", func(t *testing.T) {
				rc := dialRunner(t, r)
				resp, b := rc.roundTrip("POST /x HTTP/1.1\r\nHost: fn\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"+
					"5;ext=1\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nX-Trailer: t\r\n\r\n", "POST")
				if resp.StatusCode != 200 || echoedEvent(t, b) != compact(`{"a": 1}`) || resp.ContentLength != int64(len(b)) || resp.Close {
					t.Errorf("chunked: %d (length %d, close %v) %s", resp.StatusCode, resp.ContentLength, resp.Close, b)
				}
				resp, b = rc.roundTrip("POST /y HTTP/1.1\r\nHost: fn\r\nContent-Length: 7\r\n\r\n[1,2,3]", "POST")
				if resp.StatusCode != 200 || echoedEvent(t, b) != compact(`[1, 2, 3]`) || resp.Close {
					t.Errorf("second request: %d (close %v) %s", resp.StatusCode, resp.Close, b)
				}
				// Two requests in one write (pipelined).
				if _, err := io.WriteString(rc.c, "GET /1 HTTP/1.1\r\nHost: fn\r\n\r\nPOST /2 HTTP/1.1\r\nHost: fn\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
					t.Fatal(err)
				}
				for i := range 2 {
					resp, err := http.ReadResponse(rc.br, &http.Request{Method: "GET"})
					if err != nil {
						t.Fatalf("pipelined reply %d: %v", i, err)
					}
					b, _ := io.ReadAll(resp.Body)
					if resp.StatusCode != 200 || echoedEvent(t, b) != "{}" {
						t.Errorf("pipelined reply %d: %d %s", i, resp.StatusCode, b)
					}
				}
				resp, b = rc.roundTrip("HEAD /z HTTP/1.1\r\nHost: fn\r\n\r\n", "HEAD")
				if resp.StatusCode != 200 || len(b) != 0 || resp.ContentLength <= 0 {
					t.Errorf("HEAD: %d (length %d) %q", resp.StatusCode, resp.ContentLength, b)
				}
				resp, b = rc.roundTrip("GET /z HTTP/1.1\r\nHost: fn\r\nConnection: close\r\n\r\n", "GET")
				if resp.StatusCode != 200 || echoedEvent(t, b) != "{}" || !resp.Close {
					t.Errorf("Connection: close: %d (close %v) %s", resp.StatusCode, resp.Close, b)
				}
				rc.closed()
			})

			t.Run("HTTP/1.0", func(t *testing.T) {
				rc := dialRunner(t, r)
				resp, b := rc.roundTrip("POST / HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 8\r\n\r\n{\"v\":10}", "POST")
				if resp.StatusCode != 200 || echoedEvent(t, b) != compact(`{"v": 10}`) || resp.Close {
					t.Errorf("HTTP/1.0 keep-alive: %d (close %v) %s", resp.StatusCode, resp.Close, b)
				}
				resp, b = rc.roundTrip("GET / HTTP/1.0\r\n\r\n", "GET")
				if resp.StatusCode != 200 || echoedEvent(t, b) != "{}" || resp.ContentLength != int64(len(b)) {
					t.Errorf("HTTP/1.0: %d (length %d) %s", resp.StatusCode, resp.ContentLength, b)
				}
				rc.closed()
			})

			t.Run("Expect: 100-continue", func(t *testing.T) {
				rc := dialRunner(t, r)
				if _, err := io.WriteString(rc.c, "POST / HTTP/1.1\r\nHost: fn\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				line, err := rc.br.ReadString('\n')
				if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
					t.Fatalf("interim reply %q, %v", line, err)
				}
				if line, err = rc.br.ReadString('\n'); err != nil || line != "\r\n" {
					t.Fatalf("interim reply's end %q, %v", line, err)
				}
				resp, b := rc.roundTrip("[]", "POST")
				if resp.StatusCode != 200 || echoedEvent(t, b) != "[]" {
					t.Errorf("after 100 Continue: %d %s", resp.StatusCode, b)
				}
			})

			t.Run("one connection for many calls", func(t *testing.T) {
				var dials atomic.Int32
				client := &http.Client{Transport: &http.Transport{
					DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
						dials.Add(1)
						return (&net.Dialer{}).DialContext(ctx, network, addr)
					},
				}}
				defer client.CloseIdleConnections()
				for i := range 5 {
					body := fmt.Sprintf(`{"i":%d}`, i)
					resp, err := client.Post("http://"+r.addr+"/", "application/json", strings.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || echoedEvent(t, b) != compact(fmt.Sprintf(`{"i": %d}`, i)) {
						t.Errorf("call %d: %d %s", i, resp.StatusCode, b)
					}
				}
				if n := dials.Load(); n != 1 {
					t.Errorf("%d connections dialled for 5 sequential calls, want 1", n)
				}
			})

			t.Run("body too large", func(t *testing.T) {
				rc := dialRunner(t, r)
				resp, _ := rc.roundTrip("POST / HTTP/1.1\r\nHost: fn\r\nContent-Length: 67108865\r\n\r\n", "POST")
				if resp.StatusCode != 413 || !resp.Close {
					t.Errorf("status %d (close %v), want 413 and the connection closed", resp.StatusCode, resp.Close)
				}
			})

			t.Run("header too large", func(t *testing.T) {
				rc := dialRunner(t, r)
				if _, err := io.WriteString(rc.c, "GET / HTTP/1.1\r\nHost: fn\r\nX-Big: "+strings.Repeat("a", 70<<10)+"\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(rc.br, &http.Request{Method: "GET"})
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 431 {
					t.Errorf("status %d, want 431", resp.StatusCode)
				}
			})

			t.Run("malformed request", func(t *testing.T) {
				rc := dialRunner(t, r)
				resp, _ := rc.roundTrip("POST / HTTP/1.1\r\nHost: fn\r\nContent-Length: x\r\n\r\n", "POST")
				if resp.StatusCode != 400 {
					t.Errorf("status %d, want 400", resp.StatusCode)
				}
			})
		})
	}
}

// TestRunnerConcurrency: two calls run at once, each waiting (bounded)
// until the other has started.
func TestRunnerConcurrency(t *testing.T) {
	for _, l := range bothLangs {
		t.Run(l.name, func(t *testing.T) {
			r := startLambda(t, l)
			meet := t.TempDir()
			type result struct {
				status int
				body   string
				err    error
			}
			results := make(chan result, 2)
			for _, p := range [][2]string{{"a", "b"}, {"b", "a"}} {
				go func() {
					ev, _ := json.Marshal(map[string]string{"op": "meet", "dir": meet, "me": p[0], "other": p[1]})
					resp, err := r.client.Post("http://"+r.addr+"/", "application/json", bytes.NewReader(ev))
					if err != nil {
						results <- result{err: err}
						return
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					results <- result{resp.StatusCode, string(b), err}
				}()
			}
			for range 2 {
				res := <-results
				if res.err != nil || res.status != 200 || res.body != `"met"` {
					t.Errorf("call: %d %q %v, want 200 \"met\"", res.status, res.body, res.err)
				}
			}
		})
	}
}

// TestRunnerListenHost: BRISK_LISTEN_HOST is the address bound.
func TestRunnerListenHost(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ln.Close()
	for _, l := range bothLangs {
		t.Run(l.name, func(t *testing.T) {
			files := map[string]string{"app.py": "def h(e, c):\n    return 'v6'\n"}
			if l.name == "node" {
				files = map[string]string{"app.js": "exports.h = () => 'v6';\n"}
			}
			env := lambdaEnv("app.h")
			env["BRISK_LISTEN_HOST"] = "::1"
			r := startRunner(t, l, files, env)
			r.mustListen(t)
			runnerCall{status: 200, wantType: "application/json", wantBody: `"v6"`}.run(t, r)
		})
	}
}
