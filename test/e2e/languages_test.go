package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/runtime/process"
)

// writeTree writes files (path → content) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, data := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Python and Node functions deployed from source run on the process and
// native runtimes under both handler contracts, with their env, secrets
// and logs, and Lambda's error shape.
func TestLanguageFunctions(t *testing.T) {
	for _, rt := range []string{"process", "native", "containerd"} {
		t.Run(rt, func(t *testing.T) {
			if rt != "process" && os.Geteuid() != 0 {
				t.Skipf("the %s runtime needs root (CI runs as root)", rt)
			}
			testLanguageFunctions(t, rt)
		})
	}
}

func testLanguageFunctions(t *testing.T, rt string) {
	c := newCluster(t)
	if rt == "containerd" {
		// The language base images are built by the worker, from its own
		// interpreters: nothing is imported beforehand.
		ctr := containerdClient(t)
		t.Cleanup(func() { // after the cluster's own cleanup has stopped it
			if leaks := containerdLeaks(ctr); len(leaks) > 0 {
				t.Errorf("left after the cluster stopped: %v", leaks)
			}
		})
		c.up(t, containerdArgs...)
	} else {
		c.up(t, "--runtime", rt)
	}
	c.mustBrisk(t, "secret", "create", "db-pass", "--from-literal", "s3cret")

	pyLambda := writeTree(t, map[string]string{
		"app.py": `import os, json
from helpers.greet import greeting
LOADED = os.getpid()
def handler(event, context):
    if event.get("fail"):
        raise ValueError("asked to fail")
    print("handling", event.get("name"), flush=True)
    with open("/var/openfaas/secrets/db-pass") as f:
        secret = f.read()
    return {"greeting": greeting(event.get("name", "world")), "fn": context.function_name,
            "request_id": context.aws_request_id, "env": os.environ.get("GREETING_STYLE"), "secret": secret,
            "task_root": os.environ.get("LAMBDA_TASK_ROOT"), "cwd_files": sorted(os.listdir(".")), "uid": os.getuid()}
`,
		"helpers/__init__.py": "",
		"helpers/greet.py":    "def greeting(n):\n    return 'hello, ' + n\n",
	})
	c.mustBrisk(t, "fn", "deploy", "py-lambda", "--code", pyLambda, "--lang", "python", "--handler", "app.handler",
		"--env", "GREETING_STYLE=warm", "--secret", "db-pass", "--public", "--min", "1", "--wait")
	inv := c.invokeH(t, "py-lambda", `{"name": "ada"}`, "X-Call-Id", "call-42")
	var got map[string]any
	if err := json.Unmarshal(inv.body, &got); err != nil || inv.status != 200 {
		t.Fatalf("py-lambda: %d %s", inv.status, inv.body)
	}
	if got["greeting"] != "hello, ada" || got["fn"] != "py-lambda" || got["request_id"] != "call-42" || got["env"] != "warm" || got["secret"] != "s3cret" {
		t.Fatalf("py-lambda answered %s", inv.body)
	}
	if files, _ := got["cwd_files"].([]any); len(files) != 2 {
		t.Fatalf("py-lambda's working directory holds %v; want its code (app.py, helpers)", got["cwd_files"])
	}
	if rt == "containerd" && got["uid"] != float64(65534) {
		t.Fatalf("uid %v in the base image, want nobody's (65534)", got["uid"])
	}
	if uid, _ := got["uid"].(float64); rt == "process" && os.Geteuid() == 0 && uid < process.FunctionUIDBase {
		t.Fatalf("uid %v on the process runtime as root, want the function's own (from %d)", got["uid"], process.FunctionUIDBase)
	}
	if rt != "process" && got["task_root"] != "/var/task" {
		t.Fatalf("task root %v, want /var/task", got["task_root"])
	}
	if rt != "containerd" { // templates: process and native
		eventually(t, 10*time.Second, "the template's memory in the node's status", func() bool {
			st, err := c.cl.Status(t.Context())
			return err == nil && len(st.Nodes) == 1 && st.Nodes[0].Templates.MemoryMB > 0
		})
	}
	inv = c.invokeH(t, "py-lambda", `{"fail": true}`)
	if inv.status != 500 || !strings.Contains(string(inv.body), `"errorType": "ValueError"`) && !strings.Contains(string(inv.body), `"errorType":"ValueError"`) {
		t.Fatalf("a raising handler: %d %s; want 500 with Lambda's error shape", inv.status, inv.body)
	}
	eventually(t, 10*time.Second, "the handler's print in fn logs", func() bool {
		out, _ := c.brisk(t, "fn", "logs", "py-lambda")
		return strings.Contains(out, "handling ada")
	})

	nodeLambda := writeTree(t, map[string]string{
		"index.js": `const os = require("os");
exports.handler = async (event, context) => ({ sum: event.a + event.b, fn: context.functionName, id: context.awsRequestId, env: process.env.GREETING_STYLE || null });
`,
	})
	c.mustBrisk(t, "fn", "deploy", "node-lambda", "--code", nodeLambda, "--public", "--min", "1", "--wait")
	inv = c.invokeH(t, "node-lambda", `{"a": 2, "b": 40}`, "X-Call-Id", "call-7")
	if inv.status != 200 || !strings.Contains(string(inv.body), `"sum":42`) || !strings.Contains(string(inv.body), `"fn":"node-lambda"`) || !strings.Contains(string(inv.body), `"id":"call-7"`) {
		t.Fatalf("node-lambda: %d %s", inv.status, inv.body)
	}

	pyHTTP := writeTree(t, map[string]string{
		"handler.py": `def handle(event, context):
    return {"statusCode": 201, "headers": {"X-Method": event.method}, "body": "got " + event.body.decode() + " q=" + event.query.get("q", "")}
`,
	})
	c.mustBrisk(t, "fn", "deploy", "py-http", "--code", pyHTTP, "--contract", "http", "--public", "--min", "1", "--wait")
	resp, err := c.hc.Post("http://"+c.invokeAddr+"/function/py-http/path?q=7", "text/plain", strings.NewReader("abc"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != "got abc q=7" || resp.Header.Get("X-Method") != "POST" {
		t.Fatalf("py-http: %d %q %v", resp.StatusCode, body, resp.Header)
	}

	nodeHTTP := writeTree(t, map[string]string{
		"handler.js": `module.exports = async (event, context) => context.status(202).headers({"X-Path": event.path}).succeed({echo: event.body});
`,
	})
	c.mustBrisk(t, "fn", "deploy", "node-http", "--code", filepath.Join(nodeHTTP, "handler.js"), "--contract", "http", "--public", "--min", "1", "--wait")
	inv = c.invokeH(t, "node-http", `{"x": 1}`)
	if inv.status != 202 || !strings.Contains(string(inv.body), `"echo":{"x":1}`) {
		t.Fatalf("node-http: %d %s", inv.status, inv.body)
	}
}

// invokeH posts body to /function/name with headers (name, value pairs).
func (c *cluster) invokeH(t *testing.T, name, body string, headers ...string) invocation {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.scheme+"://"+c.invokeAddr+"/function/"+name, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("invoke %s: %v", name, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return invocation{status: resp.StatusCode, body: data, sandbox: resp.Header.Get("X-Brisk-Sandbox")}
}

// What goes wrong with source shows at deploy: a handler the archive lacks
// is refused before anything runs, a bad archive is refused on upload,
// and a syntax error fails `fn deploy --wait` and shows in fn get, not as
// a timeout.
func TestLanguageDeployErrors(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	src := writeTree(t, map[string]string{"app.py": "def handler(event, context):\n    return 1\n"})
	out, code := c.brisk(t, "fn", "deploy", "nohandler", "--code", src, "--handler", "main.handler")
	if code != 2 || !strings.Contains(out, "main.py") || !strings.Contains(out, "app.py") {
		t.Fatalf("a missing handler module: exit %d, %q; want a usage error naming what is and is not there", code, out)
	}
	// The API refuses it as well, whoever calls it.
	up := c.upload(t, zipOf(t, map[string]string{"app.py": "x = 1\n"}))
	status, msg := c.postSpec(t, `{"name": "nohandler", "code": {"language": "python", "handler": "main.handler", "digest": "`+up+`"}}`)
	if status != 400 || !strings.Contains(msg, "main.py") {
		t.Fatalf("API, a missing handler: %d %s", status, msg)
	}
	status, msg = c.postSpec(t, `{"name": "nocode", "code": {"language": "python", "handler": "app.handler", "digest": "sha256:`+strings.Repeat("0", 64)+`"}}`)
	if status != 400 || !strings.Contains(msg, "has not been uploaded") {
		t.Fatalf("API, an unknown digest: %d %s", status, msg)
	}
	for name, data := range map[string][]byte{"garbage": []byte("not a zip"), "traversal": zipOf(t, map[string]string{"../../etc/cron.d/x": "boom"})} {
		resp, err := c.hc.Post("http://"+c.admin+"/v1/code", "application/zip", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "invalid code archive") {
			t.Fatalf("%s upload: %d %s", name, resp.StatusCode, b)
		}
	}

	// An archive goes with the last function (or kept revision) that ran
	// it, not before.
	gc := c.upload(t, zipOf(t, map[string]string{"app.py": "def handler(event, context):\n    return 1\n"}))
	for _, name := range []string{"gc-a", "gc-b"} {
		if status, msg := c.postSpec(t, `{"name": "`+name+`", "code": {"language": "python", "handler": "app.handler", "digest": "`+gc+`"}}`); status != 201 {
			t.Fatalf("deploy %s: %d %s", name, status, msg)
		}
	}
	c.mustBrisk(t, "fn", "delete", "gc-a")
	if status, msg := c.postSpec(t, `{"name": "gc-c", "code": {"language": "python", "handler": "app.handler", "digest": "`+gc+`"}}`); status != 201 {
		t.Fatalf("the archive went with gc-a while gc-b runs it: %d %s", status, msg)
	}
	c.mustBrisk(t, "fn", "delete", "gc-b")
	c.mustBrisk(t, "fn", "delete", "gc-c")
	if status, msg := c.postSpec(t, `{"name": "gc-d", "code": {"language": "python", "handler": "app.handler", "digest": "`+gc+`"}}`); status != 400 || !strings.Contains(msg, "has not been uploaded") {
		t.Fatalf("the archive outlived every function that ran it: %d %s", status, msg)
	}

	bad := writeTree(t, map[string]string{"app.py": "def handler(event, context)\n    return 1\n"})
	out, code = c.brisk(t, "fn", "deploy", "broken", "--code", bad, "--handler", "app.handler", "--min", "1", "--wait", "--wait-timeout", "60s")
	if code == 0 || !strings.Contains(out, "SyntaxError") {
		t.Fatalf("a syntax error: exit %d, %q; want --wait to fail naming it", code, out)
	}
	eventually(t, 30*time.Second, "fn get shows the syntax error", func() bool {
		st := c.fn(t, "broken").Status
		return strings.Contains(st.LastFailure, "SyntaxError") && strings.Contains(st.LastFailure, "cannot load handler")
	})
}

// upload posts an archive to /v1/code and returns its digest.
func (c *cluster) upload(t *testing.T, data []byte) string {
	t.Helper()
	resp, err := c.hc.Post("http://"+c.admin+"/v1/code", "application/zip", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Digest string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 201 {
		t.Fatalf("upload: %d, %v", resp.StatusCode, err)
	}
	return out.Digest
}

func (c *cluster) postSpec(t *testing.T, spec string) (int, string) {
	t.Helper()
	resp, err := c.hc.Post("http://"+c.admin+"/v1/functions", "application/json", strings.NewReader(spec))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// zipOf zips files with the system's zip-compatible writer (Python's
// zipfile, so that the archive is not brisk's own making).
func zipOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var names, contents []string
	for n, c := range files {
		names, contents = append(names, n), append(contents, c)
	}
	js, _ := json.Marshal(map[string][]string{"names": names, "contents": contents})
	cmd := exec.Command("/usr/bin/python3", "-c", `import io, json, sys, zipfile
d = json.loads(sys.argv[1]); b = io.BytesIO()
with zipfile.ZipFile(b, "w") as z:
    for n, c in zip(d["names"], d["contents"]):
        z.writestr(n, c)
sys.stdout.buffer.write(b.getvalue())`, string(js))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("zip: %v", err)
	}
	return out
}

// A Lambda handler in Python, called through boto3 unchanged: its result,
// and an exception as Lambda reports it (FunctionError Unhandled, the
// error's type and message in the payload).
func TestLambdaHandlerThroughBoto3(t *testing.T) {
	py := pyClients(t)
	c := newCluster(t)
	c.up(t)
	src := writeTree(t, map[string]string{"lambda_function.py": `import json
def lambda_handler(event, context):
    if event.get("boom"):
        raise KeyError("boom")
    return {"statusCode": 200, "body": json.dumps({"twice": event["n"] * 2}), "left_ms_positive": context.get_remaining_time_in_millis() > 0}
`})
	c.mustBrisk(t, "fn", "deploy", "orders", "--code", src, "--min", "1", "--wait")
	creds := c.mustBrisk(t, "token", "aws", "--env")
	env := append(os.Environ(), "AWS_DEFAULT_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	for _, line := range strings.Split(strings.TrimSpace(creds), "\n") {
		env = append(env, strings.TrimPrefix(line, "export "))
	}
	script := `
import json, sys, boto3
from botocore.config import Config
cl = boto3.client("lambda", endpoint_url=sys.argv[1], config=Config(retries={"max_attempts": 1}))
ok = cl.invoke(FunctionName="orders", Payload=json.dumps({"n": 21}))
bad = cl.invoke(FunctionName="orders", Payload=json.dumps({"boom": 1}))
print(json.dumps({"ok": json.loads(ok["Payload"].read()), "ok_error": ok.get("FunctionError", ""),
                  "bad": json.loads(bad["Payload"].read()), "bad_error": bad.get("FunctionError", ""), "bad_status": bad["StatusCode"]}))
`
	cmd := exec.Command(filepath.Join(py, "bin", "python"), "-c", script, "http://"+c.invokeAddr)
	cmd.Env = env
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("boto3: %v\n%s", err, b)
	}
	var got struct {
		OK        map[string]any `json:"ok"`
		OKError   string         `json:"ok_error"`
		Bad       map[string]any `json:"bad"`
		BadError  string         `json:"bad_error"`
		BadStatus int            `json:"bad_status"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("boto3 said %s: %v", b, err)
	}
	if got.OK["body"] != `{"twice": 42}` || got.OK["left_ms_positive"] != true || got.OKError != "" {
		t.Fatalf("boto3 ok: %s", b)
	}
	if got.BadError != "Unhandled" || got.BadStatus != 200 || got.Bad["errorType"] != "KeyError" || !strings.Contains(got.Bad["errorMessage"].(string), "boom") {
		t.Fatalf("boto3 error: %s", b)
	}
}
