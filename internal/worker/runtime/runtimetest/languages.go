package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// PythonHeavySource is a Python function whose imports take what ROUND3's
// measurements did (100–270 ms on a 2-core machine): the cost a template
// pays once and a fresh start every time. The runtimes' PythonColdStart
// benchmarks start it.
const PythonHeavySource = `import json, decimal, asyncio, email.mime.multipart, xml.etree.ElementTree, http.server
def handler(event, context):
    return {"ok": True}
`

// langCase is one function from source and what its sandbox must answer.
type langCase struct {
	name, lang, handler, contract string
	files                         map[string]string
	// calls are POSTed in order, each body with the status and the
	// substrings its reply must have.
	calls []langCall
}

type langCall struct {
	body   string
	status int
	want   []string
}

var langCases = []langCase{
	{name: "py-lambda", lang: spec.LangPython, handler: "app.handler", contract: spec.ContractLambda,
		files: map[string]string{"app.py": `import os
COUNT = 0
def handler(event, context):
    global COUNT
    COUNT += 1
    if event.get("fail"):
        raise ValueError("asked to fail")
    return {"echo": event.get("x"), "count": COUNT, "env": os.environ.get("CONF_VAR"), "fn": context.function_name,
            "task": sorted(os.listdir(os.environ["LAMBDA_TASK_ROOT"]))}
`},
		calls: []langCall{
			// The readiness check's GET / was the first call.
			{`{"x": "py"}`, 200, []string{`"echo": "py"`, `"count": 2`, `"env": "v1"`, `"fn": "lang-py-lambda"`, `"task": ["app.py"]`}},
			{`{"x": "again"}`, 200, []string{`"count": 3`}}, // module state lives as long as the sandbox
			{`{"fail": true}`, 500, []string{`"errorType": "ValueError"`, `asked to fail`}},
		}},
	{name: "py-http", lang: spec.LangPython, handler: "handler.handle", contract: spec.ContractHTTP,
		files: map[string]string{"handler.py": `def handle(event, context):
    return {"statusCode": 201, "body": "py got " + event.body.decode()}
`},
		calls: []langCall{{`{"a": 1}`, 201, []string{`py got {"a": 1}`}}}},
	{name: "node-lambda", lang: spec.LangNode, handler: "index.handler", contract: spec.ContractLambda,
		files: map[string]string{"index.js": `let count = 0;
exports.handler = async (event, context) => {
  if (event.fail) throw new TypeError("asked to fail");
  return { echo: event.x, count: ++count, env: process.env.CONF_VAR, fn: context.functionName };
};
`},
		calls: []langCall{
			{`{"x": "node"}`, 200, []string{`"echo":"node"`, `"count":2`, `"env":"v1"`, `"fn":"lang-node-lambda"`}},
			{`{"x": "again"}`, 200, []string{`"count":3`}},
			{`{"fail": true}`, 500, []string{`"errorType":"TypeError"`}},
		}},
	{name: "node-http", lang: spec.LangNode, handler: "handler", contract: spec.ContractHTTP,
		files: map[string]string{"handler.js": `module.exports = async (event, context) => context.status(202).succeed({ echo: event.body });
`},
		calls: []langCall{{`{"a": 1}`, 202, []string{`"echo":{"a":1}`}}}},
}

// Functions from source (package lang) run on the runtime: a Python and a
// Node function under each handler contract serve their calls, with their
// env, their code at LAMBDA_TASK_ROOT, module state kept between calls of
// one sandbox and Lambda's error shape; a function whose module does not
// load never serves and its sandbox exits; and nothing is left after Kill
// (and, where the runtime keeps templates, after they are stopped).
func testLanguages(t *testing.T, h Harness) {
	if h.LangTarget == nil {
		t.Skip("the runtime runs no functions from source (Harness.LangTarget)")
	}
	e := newEnv(t, h)
	before := e.leaks()
	// The sandbox's user must reach the code on the host's file system
	// when the runtime cannot bind it (the process runtime without root):
	// not under t.TempDir, which is 0700.
	dir, err := os.MkdirTemp("", "brisk-rtconf-lang-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	archives := map[string][]byte{}
	m, err := lang.New(lang.Config{Dir: dir, Fetch: func(_ context.Context, d string) ([]byte, error) {
		if b, ok := archives[d]; ok {
			return b, nil
		}
		return nil, fmt.Errorf("no archive %s", d)
	}})
	if err != nil {
		t.Fatal(err)
	}
	target := h.LangTarget(e.runtime())
	prepare := func(c langCase) runtime.Spec {
		files := map[string][]byte{}
		for p, src := range c.files {
			files[p] = []byte(src)
		}
		data, err := codezip.ZipFiles(files)
		if err != nil {
			t.Fatal(err)
		}
		digest := codezip.Digest(data)
		archives[digest] = data
		f := &spec.Function{Name: "lang-" + c.name, Revision: 1, Concurrency: 1, Env: map[string]string{"CONF_VAR": "v1"},
			Code: &spec.Code{Language: c.lang, Handler: c.handler, Contract: c.contract, Digest: digest}}
		f.ApplyDefaults()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		s, err := m.Prepare(ctx, runtime.Spec{ID: e.newID(), Function: f}, target)
		if err != nil {
			t.Fatalf("%s: Prepare: %v", c.name, err)
		}
		return s
	}
	for _, c := range langCases {
		if m.Interpreter(c.lang) == "" {
			t.Logf("%s: no %s interpreter on this host; skipped", c.name, c.lang)
			continue
		}
		s := prepare(c)
		inst, err := e.tryCreateSpec(s)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := e.awaitServing(inst); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, call := range c.calls {
			status, body := post(t, inst.Addr, s.ID, h.Route, call.body)
			if status != call.status {
				t.Errorf("%s: POST %s: %d %s, want %d", c.name, call.body, status, body, call.status)
				continue
			}
			for _, w := range call.want {
				if !strings.Contains(body, w) {
					t.Errorf("%s: POST %s answered %s, without %s", c.name, call.body, body, w)
				}
			}
		}
		if err := e.kill(s.ID); err != nil {
			t.Errorf("%s: Kill: %v", c.name, err)
		}
	}

	// A module that does not load: the runner exits before it listens.
	if m.Interpreter(spec.LangPython) != "" {
		s := prepare(langCase{name: "py-broken", lang: spec.LangPython, handler: "app.handler", contract: spec.ContractLambda,
			files: map[string]string{"app.py": "def handler(event, context:\n    return 1\n"}})
		inst, err := e.tryCreateSpec(s)
		if err != nil {
			// A runtime that loads the module before Create returns (a
			// template) says why.
			if !strings.Contains(err.Error(), "SyntaxError") {
				t.Errorf("py-broken: Create failed with %v, which does not name the SyntaxError", err)
			}
		} else {
			t.Logf("py-broken: Create returned; waiting for the sandbox to exit")
			if inst.Exited == nil {
				t.Error("py-broken: the sandbox of a module with a syntax error has no Exited to close")
			} else if !awaitClosed(inst.Exited) {
				t.Error("py-broken: a module with a syntax error left its sandbox running")
			} else if inst.ExitErr() == nil {
				t.Error("py-broken: the sandbox exited with no error")
			}
			if err := e.kill(s.ID); err != nil && !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("py-broken: Kill: %v", err)
			}
		}
	}
	// Templates (pre-initialised runtimes) outlive their sandboxes by
	// design, until evicted: stop them as a worker does when it stops.
	if ts, ok := e.runtime().(interface{ StopTemplates() }); ok {
		ts.StopTemplates()
	}
	e.awaitLeaks(before, "after the language functions were killed")
}

// post sends body to the sandbox at addr and returns its status and reply.
func post(t *testing.T, addr, id string, route func(*http.Request, string), body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if route != nil {
		route(req, id)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TemplateRuntime is a runtime that keeps templates.
type TemplateRuntime interface {
	runtime.TemplateHolder
	StopTemplates()
}

// TemplateMemory checks what a runtime with templates reports for its
// node: no memory and no template before load (which makes one Python
// function's template and waits for it), several MiB and that function's
// template after, and neither once its templates are stopped.
func TemplateMemory(t *testing.T, r TemplateRuntime, load func()) {
	t.Helper()
	if got := r.TemplateMemoryMB(); got != 0 {
		t.Fatalf("%d MiB held before any template", got)
	}
	load()
	// An interpreter that imported its function: several MiB at least.
	got := r.TemplateMemoryMB()
	t.Logf("one template holds %d MiB", got)
	if got < 4 {
		t.Fatalf("a loaded Python template measured at %d MiB", got)
	}
	if h := r.HeldTemplates(); len(h) != 1 || h[0].Revision != 1 || h[0].Function == "" {
		t.Fatalf("held templates %+v, want the function's one", h)
	}
	r.StopTemplates()
	if got := r.TemplateMemoryMB(); got != 0 {
		t.Fatalf("%d MiB held after the templates stopped", got)
	}
	if h := r.HeldTemplates(); len(h) != 0 {
		t.Fatalf("held templates %+v after they stopped", h)
	}
}
