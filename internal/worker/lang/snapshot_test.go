package lang

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The Node runner's startup snapshots: node --snapshot-blob BLOB
// --build-snapshot runner.js loads the handler and writes the heap to BLOB;
// node --snapshot-blob BLOB starts from it and serves.

// buildNodeSnapshot writes files into a new directory and builds a snapshot
// of the Node runner loading env's handler from it. It returns the code's
// directory, the snapshot's path, the build's combined output and its exit
// status.
func buildNodeSnapshot(t *testing.T, files map[string]string, env map[string]string) (dir, blob, out string, code int) {
	t.Helper()
	nodeLang.need(t)
	dir = writeFunctionCode(t, files)
	blob = filepath.Join(t.TempDir(), "fn.blob")
	cmd := exec.CommandContext(t.Context(), nodeLang.interp, "--snapshot-blob", blob, "--build-snapshot", "./node/runner.js")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "BRISK_CODE_DIR=" + dir}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("building a snapshot: %v", err)
	}
	return dir, blob, b.String(), cmd.ProcessState.ExitCode()
}

// startFromSnapshot starts node from blob with env (startRunner's: PORT
// and BRISK_LISTEN_HOST are set) and BRISK_CODE_DIR dir, the build's.
func startFromSnapshot(t *testing.T, blob, dir string, env map[string]string) *runnerProc {
	t.Helper()
	l := runnerLang{"node snapshot", nodeLang.interp, []string{"--snapshot-blob", blob}}
	e := map[string]string{"BRISK_CODE_DIR": dir} // over startRunner's own, empty directory
	for k, v := range env {
		e[k] = v
	}
	return startRunner(t, l, nil, e)
}

const jsSnapshotted = `const crypto = require('crypto');
const dep = require('dep');
const counter = require('./lib/counter');

// What the module computes as it loads is the build's.
const atLoad = process.env.BRISK_FUNCTION;
const loadUUID = crypto.randomUUID(); // begins crypto's batch of UUIDs while building
const loadRandom = Math.random();
const loadInt = crypto.randomInt(2 ** 47); // begins crypto's batch for randomInt
process.env.FROM_INIT ??= 'set at load'; // as dotenv does
process.env.ALWAYS = 'set at load';
let timerRan = false;
setTimeout(() => { timerRan = true; }, 1); // runs while building
console.log('loaded');

exports.handler = async (event, context) => {
  if (event.op === 'lazy') return require('./lib/lazy').v;
  if (event.op === 'import') return (await import('./lib/esm.mjs')).v;
  console.log('called', context.functionName);
  return {
    functionName: context.functionName,
    arn: context.invokedFunctionArn,
    memoryLimitInMB: context.memoryLimitInMB,
    remainingOk: context.getRemainingTimeInMillis() <= 7000,
    envFunction: process.env.BRISK_FUNCTION,
    port: process.env.PORT,
    extra: process.env.EXTRA === undefined ? null : process.env.EXTRA,
    fromInit: process.env.FROM_INIT,
    always: process.env.ALWAYS,
    atLoad,
    timerRan,
    dep: dep.v,
    count: counter.next(),
    random: Math.random(),
    loadRandom,
    int: crypto.randomInt(2 ** 47),
    loadInt,
    uuid: crypto.randomUUID(),
    webUUID: globalThis.crypto.randomUUID(),
    loadUUID,
    dirname: __dirname,
    cwd: process.cwd(),
  };
};
`

type snapshotReply struct {
	FunctionName    string  `json:"functionName"`
	ARN             string  `json:"arn"`
	MemoryLimitInMB string  `json:"memoryLimitInMB"`
	RemainingOk     bool    `json:"remainingOk"`
	EnvFunction     string  `json:"envFunction"`
	Port            string  `json:"port"`
	Extra           *string `json:"extra"`
	FromInit        string  `json:"fromInit"`
	Always          string  `json:"always"`
	AtLoad          string  `json:"atLoad"`
	TimerRan        bool    `json:"timerRan"`
	Dep             string  `json:"dep"`
	Count           int     `json:"count"`
	Random          float64 `json:"random"`
	LoadRandom      float64 `json:"loadRandom"`
	Int             int64   `json:"int"`
	LoadInt         int64   `json:"loadInt"`
	UUID            string  `json:"uuid"`
	WebUUID         string  `json:"webUUID"`
	LoadUUID        string  `json:"loadUUID"`
	Dirname         string  `json:"dirname"`
	Cwd             string  `json:"cwd"`
}

func TestRunnerSnapshot(t *testing.T) {
	dir, blob, out, code := buildNodeSnapshot(t, map[string]string{
		"index.js":                      jsSnapshotted,
		"lib/counter.js":                "let n = 0;\nexports.next = () => ++n;\n",
		"lib/lazy.js":                   "exports.v = 'lazy';\n",
		"lib/esm.mjs":                   "export const v = 'esm';\n",
		"node_modules/dep/package.json": `{"name": "dep", "main": "main.js"}`,
		"node_modules/dep/main.js":      "exports.v = 'dep';\n",
	}, map[string]string{
		"BRISK_HANDLER":    "index.handler",
		"BRISK_CONTRACT":   "lambda",
		"BRISK_FUNCTION":   "build-fn",
		"BRISK_TIMEOUT_MS": "1000",
		"BRISK_MEMORY_MB":  "64",
		"PORT":             "1",
		"EXTRA":            "build",
	})
	if code != 0 {
		t.Fatalf("the build exited with status %d:\n%s", code, out)
	}
	if out != "loaded\n" {
		t.Errorf("the build's output %q, want only the module's own", out)
	}
	if fi, err := os.Stat(blob); err != nil || fi.Size() == 0 {
		t.Fatalf("no snapshot: %v", err)
	}

	start := func(name string, more map[string]string) *runnerProc {
		env := map[string]string{
			"BRISK_HANDLER":    "index.handler",
			"BRISK_FUNCTION":   name,
			"BRISK_TIMEOUT_MS": "7000",
			"BRISK_MEMORY_MB":  "256",
		}
		for k, v := range more {
			env[k] = v
		}
		r := startFromSnapshot(t, blob, dir, env)
		r.mustListen(t)
		return r
	}
	a := start("fn-a", map[string]string{"EXTRA": "a", "FROM_INIT": "a's own"})
	b := start("fn-b", nil)
	call := func(r *runnerProc) snapshotReply {
		t.Helper()
		resp, body := r.do(t, "POST", "/", nil, "{}")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s; stderr:\n%s", resp.StatusCode, body, r.stderr.String())
		}
		var s snapshotReply
		if err := json.Unmarshal(body, &s); err != nil {
			t.Fatalf("body %s: %v", body, err)
		}
		return s
	}
	a1, a2, b1 := call(a), call(a), call(b)

	for _, c := range []struct {
		r    *runnerProc
		s    snapshotReply
		name string
	}{{a, a1, "fn-a"}, {b, b1, "fn-b"}} {
		_, port, _ := strings.Cut(c.r.addr, ":")
		if c.s.FunctionName != c.name || c.s.EnvFunction != c.name || c.s.ARN != "arn:aws:lambda:brisk:000000000000:function:"+c.name ||
			c.s.Port != port || c.s.MemoryLimitInMB != "256" || !c.s.RemainingOk {
			t.Errorf("%s: name %q, BRISK_FUNCTION %q, ARN %q, PORT %q (want %s), memory %q, remaining ok %v: the build's environment, not its own",
				c.name, c.s.FunctionName, c.s.EnvFunction, c.s.ARN, c.s.Port, port, c.s.MemoryLimitInMB, c.s.RemainingOk)
		}
		if c.s.AtLoad != "build-fn" || c.s.Always != "set at load" || !c.s.TimerRan || c.s.Dep != "dep" || c.s.Dirname != dir || c.s.Cwd != dir {
			t.Errorf("%s: what loading computed: at load %q, ALWAYS %q, timer ran %v, dep %q, __dirname %q, cwd %q (code in %s)",
				c.name, c.s.AtLoad, c.s.Always, c.s.TimerRan, c.s.Dep, c.s.Dirname, c.s.Cwd, dir)
		}
		if !requestIDRE.MatchString(c.s.UUID) || !requestIDRE.MatchString(c.s.WebUUID) {
			t.Errorf("%s: UUIDs %q, %q", c.name, c.s.UUID, c.s.WebUUID)
		}
	}
	if a1.Extra == nil || *a1.Extra != "a" || b1.Extra != nil {
		t.Errorf("EXTRA %v in fn-a, %v in fn-b; want a, and unset (not the build's)", a1.Extra, b1.Extra)
	}
	// Set by loading when unset: a process that has it keeps its own.
	if a1.FromInit != "a's own" || b1.FromInit != "set at load" {
		t.Errorf("FROM_INIT %q in fn-a, %q in fn-b; want a's own, and what loading set", a1.FromInit, b1.FromInit)
	}
	if a1.Count != 1 || a2.Count != 2 || b1.Count != 1 {
		t.Errorf("counts %d, %d in fn-a and %d in fn-b, want 1, 2 and 1", a1.Count, a2.Count, b1.Count)
	}
	if a1.LoadRandom != b1.LoadRandom || a1.LoadUUID != b1.LoadUUID || a1.LoadInt != b1.LoadInt {
		t.Errorf("values computed while loading differ: %v, %v; %q, %q; %d, %d", a1.LoadRandom, b1.LoadRandom, a1.LoadUUID, b1.LoadUUID, a1.LoadInt, b1.LoadInt)
	}
	if a1.Random == b1.Random || a1.Random == a1.LoadRandom || b1.Random == b1.LoadRandom {
		t.Errorf("Math.random(): %v in fn-a, %v in fn-b, %v while building", a1.Random, b1.Random, a1.LoadRandom)
	}
	if a1.Int == b1.Int || a1.Int == a2.Int {
		t.Errorf("crypto.randomInt(): %d, %d in fn-a, %d in fn-b", a1.Int, a2.Int, b1.Int)
	}
	uuids := map[string]bool{}
	for _, u := range []string{a1.UUID, a1.WebUUID, a2.UUID, a2.WebUUID, b1.UUID, b1.WebUUID, a1.LoadUUID} {
		if uuids[u] {
			t.Errorf("UUID %s handed out twice (fn-a %s %s, %s %s; fn-b %s %s; build %s)",
				u, a1.UUID, a1.WebUUID, a2.UUID, a2.WebUUID, b1.UUID, b1.WebUUID, a1.LoadUUID)
		}
		uuids[u] = true
	}

	// Modules required and imported at run time.
	runnerCall{body: `{"op": "lazy"}`, status: 200, wantType: "application/json", wantBody: `"lazy"`}.run(t, a)
	runnerCall{body: `{"op": "import"}`, status: 200, wantType: "application/json", wantBody: `"esm"`}.run(t, a)

	a.stop()
	b.stop()
	if got := a.stdout.String(); got != "called fn-a\ncalled fn-a\n" {
		t.Errorf("fn-a's stdout %q, want the calls' lines alone", got)
	}
	if got := b.stdout.String(); got != "called fn-b\n" {
		t.Errorf("fn-b's stdout %q", got)
	}
	for _, r := range []*runnerProc{a, b} {
		if strings.Contains(r.stderr.String(), "Warning") {
			t.Errorf("stderr has a warning:\n%s", r.stderr.String())
		}
	}
}

// TestRunnerSnapshotMismatch: a process started from a snapshot refuses a
// handler or code directory other than the build's.
func TestRunnerSnapshotMismatch(t *testing.T) {
	dir, blob, out, code := buildNodeSnapshot(t, map[string]string{"app.js": "exports.h = () => 1;\nexports.g = () => 2;\n"},
		map[string]string{"BRISK_HANDLER": "app.h"})
	if code != 0 {
		t.Fatalf("the build exited with status %d:\n%s", code, out)
	}
	for _, c := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"handler", map[string]string{"BRISK_HANDLER": "app.g"}, `brisk: cannot load handler app.g: the snapshot holds handler "app.h"`},
		{"code", map[string]string{"BRISK_HANDLER": "app.h", "BRISK_CODE_DIR": t.TempDir()}, "brisk: cannot load handler app.h: the snapshot holds code from " + dir + ", not "},
		{"contract", map[string]string{"BRISK_HANDLER": "app.h", "BRISK_CONTRACT": "grpc"}, `brisk: cannot load handler app.h: contract "grpc" is not "lambda" or "http"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startFromSnapshot(t, blob, dir, c.env)
			if r.listening {
				t.Fatalf("it listened")
			}
			<-r.done
			if code := r.cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			if errs := strings.TrimRight(r.stderr.String(), "\n"); !strings.HasPrefix(errs[strings.LastIndexByte(errs, '\n')+1:], c.want) {
				t.Errorf("stderr\n%s\nwant its last line to start with\n%s", errs, c.want)
			}
		})
	}
	// And with the build's, it serves.
	r := startFromSnapshot(t, blob, dir, map[string]string{"BRISK_HANDLER": "app.h"})
	r.mustListen(t)
	runnerCall{status: 200, wantType: "application/json", wantBody: `1`}.run(t, r)
}

// TestRunnerSnapshotRefused: what cannot be in a snapshot fails the build
// with status 3 and "brisk: cannot snapshot handler H: reason" last; a
// handler that cannot load fails it as a start would (status 1). Neither
// writes a snapshot.
func TestRunnerSnapshotRefused(t *testing.T) {
	cases := []struct {
		name    string
		files   map[string]string
		handler string
		code    int
		want    string // the last line of output starts with this
	}{
		{"ES module", map[string]string{"index.mjs": "export const handler = async () => 1;\n"}, "index.handler",
			3, "brisk: cannot snapshot handler index.handler: index.mjs is an ES module"},
		{"type module", map[string]string{"package.json": `{"type": "module"}`, "index.js": "export const handler = async () => 1;\n"}, "index.handler",
			3, "brisk: cannot snapshot handler index.handler: "},
		{"ES module syntax in a .js file", map[string]string{"index.js": "export const handler = async () => 1;\n"}, "index.handler",
			3, "brisk: cannot snapshot handler index.handler: "},
		{"requires an ES module", map[string]string{"index.js": "const { x } = require('./x.mjs');\nexports.handler = () => x;\n", "x.mjs": "export const x = 1;\n"}, "index.handler",
			3, "brisk: cannot snapshot handler index.handler: "},
		{"requires http", map[string]string{"index.js": "const http = require('node:http');\nexports.handler = () => 1;\n"}, "index.handler",
			3, `brisk: cannot snapshot handler index.handler: node ` + "v"},
		{"native addon, caught", map[string]string{"index.js": "try { require('./a.node'); } catch {}\nexports.handler = () => 1;\n", "a.node": "not an addon"}, "index.handler",
			3, "brisk: cannot snapshot handler index.handler: "},
		{"interval", map[string]string{"index.js": "setInterval(() => {}, 1000);\nexports.handler = () => 1;\n"}, "index.handler",
			3, "brisk: cannot snapshot handler index.handler: it starts an interval timer as it loads"},
		{"timer unref'd later", map[string]string{"index.js": "Promise.resolve().then(() => setTimeout(() => {}, 1000).unref());\nexports.handler = () => 1;\n"}, "index.handler",
			3, "brisk: cannot snapshot handler index.handler: it leaves a timer unref'd as it loads"},
		{"exception at load", map[string]string{"index.js": "throw new Error('no config');\n"}, "index.handler",
			1, "brisk: cannot load handler index.handler: Error: no config"},
		{"syntax error", map[string]string{"index.js": "exports.handler = async (event) => {\n  return }}\n"}, "index.handler",
			1, "brisk: cannot load handler index.handler: SyntaxError: Unexpected token '}'"},
		{"missing export", map[string]string{"index.js": "exports.other = () => 1;\n"}, "index.handler",
			1, `brisk: cannot load handler index.handler: index.js has no export "handler"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, blob, out, code := buildNodeSnapshot(t, c.files, map[string]string{"BRISK_HANDLER": c.handler})
			if code != c.code {
				t.Errorf("exit status %d, want %d", code, c.code)
			}
			out = strings.TrimRight(out, "\n")
			if last := out[strings.LastIndexByte(out, '\n')+1:]; !strings.HasPrefix(last, c.want) {
				t.Errorf("last line\n%s\nwant it to start with\n%s\noutput:\n%s", last, c.want, out)
			}
			if _, err := os.Stat(blob); !os.IsNotExist(err) {
				t.Errorf("a snapshot was written (%v)", err)
			}
		})
	}
}
