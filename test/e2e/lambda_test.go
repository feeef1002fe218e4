package e2e

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// pyClients is the venv scripts/setup.sh --test fills with boto3 and the aws CLI.
func pyClients(t *testing.T) string {
	dir, _ := filepath.Abs("../../.cache/pyclients")
	if _, err := os.Stat(filepath.Join(dir, "bin", "aws")); err != nil {
		if os.Geteuid() == 0 {
			t.Fatalf("boto3 and the aws CLI are missing from %s: run scripts/setup.sh --test (make test does)", dir)
		}
		t.Skipf("boto3 and the aws CLI are not installed (%s): scripts/setup.sh --test installs them", dir)
	}
	return dir
}

// boto3 and the aws CLI v1, unmodified, call brisk's Lambda Invoke API:
// sync, Event, DryRun, ARNs, qualifiers, a missing function, log tails.
func TestLambdaClients(t *testing.T) {
	py := pyClients(t)
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "hello", "--builtin", "trace", "--wait")
	waits := func() float64 {
		return metricValue(t, "http://"+c.invokeAddr+"/metrics", "brisk_dataplane_unknown_function_waits_total")
	}
	waitsBefore := waits()
	creds := c.mustBrisk(t, "token", "aws", "--env")
	env := append(os.Environ(), "AWS_DEFAULT_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	for _, line := range strings.Split(strings.TrimSpace(creds), "\n") {
		env = append(env, strings.TrimPrefix(line, "export "))
	}
	endpoint := "http://" + c.invokeAddr

	script := `
import json, sys, boto3, botocore
from botocore.config import Config
cl = boto3.client("lambda", endpoint_url=sys.argv[1], config=Config(retries={"max_attempts": 1}, read_timeout=900))
out = {}
def call(key, **kw):
    try:
        r = cl.invoke(**kw)
        out[key] = {"status": r["StatusCode"], "payload": r["Payload"].read().decode() if "Payload" in r else "",
                    "error": r.get("FunctionError", ""), "version": r.get("ExecutedVersion", ""), "log": r.get("LogResult", "")}
    except botocore.exceptions.ClientError as e:
        out[key] = {"code": e.response["Error"]["Code"]}
call("sync", FunctionName="hello", Payload=b'{"ms": 2}', LogType="Tail")
call("arn", FunctionName="arn:aws:lambda:us-east-1:123456789012:function:hello", Payload=b'{}')
call("latest", FunctionName="hello", Qualifier="$LATEST", Payload=b'{}')
call("event", FunctionName="hello", InvocationType="Event", Payload=b'{"ms": 1}')
call("dryrun", FunctionName="hello", InvocationType="DryRun")
call("alias", FunctionName="hello:prod", Payload=b'{}')
call("missing", FunctionName="nope", Payload=b'{}')
call("bad", FunctionName="hello", Payload=b'not json')
print(json.dumps(out))
`
	cmd := exec.Command(filepath.Join(py, "bin", "python"), "-c", script, endpoint)
	cmd.Env = env
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("boto3: %v\n%s", err, b)
	}
	type res struct {
		Status                             int
		Payload, Error, Version, Log, Code string
	}
	var got map[string]res
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("boto3 output %q: %v", b, err)
	}
	if r := got["sync"]; r.Status != 200 || r.Error != "" || r.Version != "$LATEST" || !strings.Contains(r.Payload, `"requested_ms":2`) {
		t.Errorf("sync: %+v", r)
	} else if logs, _ := base64.StdEncoding.DecodeString(r.Log); !strings.Contains(string(logs), "REPORT RequestId") {
		t.Errorf("sync log tail %q", logs)
	}
	for _, k := range []string{"arn", "latest"} {
		if r := got[k]; r.Status != 200 || r.Error != "" {
			t.Errorf("%s: %+v", k, r)
		}
	}
	if r := got["event"]; r.Status != 202 {
		t.Errorf("event: %+v", r)
	}
	if r := got["dryrun"]; r.Status != 204 {
		t.Errorf("dry run: %+v", r)
	}
	for _, k := range []string{"alias", "missing"} {
		if r := got[k]; r.Code != "ResourceNotFoundException" {
			t.Errorf("%s: %+v, want ResourceNotFoundException", k, r)
		}
	}
	if r := got["bad"]; r.Status != 200 || r.Error != "Unhandled" {
		t.Errorf("a function error (trace's 400 on a malformed body): %+v, want 200 with FunctionError Unhandled", r)
	}

	// The aws CLI: a file with the payload, and its exit codes.
	outFile := filepath.Join(t.TempDir(), "out.json")
	aws := exec.Command(filepath.Join(py, "bin", "aws"), "lambda", "invoke", "--endpoint-url", endpoint, "--function-name", "hello",
		"--payload", `{"ms": 1}`, "--log-type", "Tail", outFile)
	aws.Env = env
	if b, err := aws.CombinedOutput(); err != nil || !strings.Contains(string(b), `"StatusCode": 200`) || !strings.Contains(string(b), "LogResult") {
		t.Fatalf("aws lambda invoke: %v\n%s", err, b)
	}
	if data, _ := os.ReadFile(outFile); !strings.Contains(string(data), `"requested_ms":1`) {
		t.Fatalf("aws lambda invoke wrote %q", data)
	}
	aws = exec.Command(filepath.Join(py, "bin", "aws"), "lambda", "invoke", "--endpoint-url", endpoint, "--function-name", "nope", outFile)
	aws.Env = env
	if b, err := aws.CombinedOutput(); err == nil || !strings.Contains(string(b), "ResourceNotFoundException") {
		t.Fatalf("aws lambda invoke of a missing function: %v\n%s", err, b)
	}
	// What the API takes the built-ins take: a 5 MiB payload to a watchdog
	// function (issue 38: it failed there at 1 MiB).
	c.mustBrisk(t, "fn", "deploy", "count", "--builtin", "watchdog", "--env", "fprocess=wc -c", "--wait", "--min", "1")
	big := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(big, []byte(`"`+strings.Repeat("x", 5<<20-2)+`"`), 0o644); err != nil {
		t.Fatal(err)
	}
	aws = exec.Command(filepath.Join(py, "bin", "aws"), "lambda", "invoke", "--endpoint-url", endpoint, "--function-name", "count",
		"--payload", "fileb://"+big, outFile)
	aws.Env = env
	if b, err := aws.CombinedOutput(); err != nil || !strings.Contains(string(b), `"StatusCode": 200`) {
		t.Fatalf("a 5 MiB payload: %v\n%s", err, b)
	}
	if data, _ := os.ReadFile(outFile); strings.TrimSpace(string(data)) != "5242880" {
		t.Fatalf("the watchdog counted %q bytes, want 5242880", data)
	}
	// A missing function is 404 at once, as AWS answers, not after the
	// grace other calls get for a function registered a moment ago (issue
	// 38: 1-1.5 s).
	if w := waits(); w != waitsBefore {
		t.Fatalf("Lambda calls of missing functions waited for them (%v waits)", w-waitsBefore)
	}
}
