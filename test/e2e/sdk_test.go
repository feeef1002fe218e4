package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// sdkProgram uses the Go SDK as a user's program in its own module does:
// the client from the environment the CLI uses, a deploy, WaitReady on a
// function at min 0 (which says why it would wait forever), a call of a
// missing function (the data plane's own 404 is an error with its reason)
// and a call that works.
const sdkProgram = `package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func main() {
	if err := run(); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.FromEnv()
	if err != nil {
		return err
	}
	f := &spec.Function{Name: "sdk-fn", Builtin: "trace", Auth: spec.AuthToken}
	if _, err := c.Create(ctx, f); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if _, err := c.WaitReady(ctx, "sdk-fn", 1); err == nil || !strings.Contains(err.Error(), "without calls") {
		return fmt.Errorf("WaitReady at min 0: %v, want why it would wait forever", err)
	}
	res, err := c.InvokeFunction(ctx, "no-such-fn", "POST", []byte("{}"), nil)
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 404 || e.Reason == "" || res == nil || res.Status != 404 {
		return fmt.Errorf("a missing function: %v %+v, want a 404 *client.Error with its reason", err, res)
	}
	res, err = c.InvokeFunction(ctx, "sdk-fn", "POST", []byte("{}"), nil)
	if err != nil || res.Status != 200 {
		return fmt.Errorf("a call: %v %+v", err, res)
	}
	return nil
}
`

// The SDK from another module: it builds with no gRPC or protobuf in it
// (issue 38: 17 MB of them came with pkg/client), finds the token the CLI
// finds, and reports errors as issue 38 asks.
func TestSDKFromAnotherModule(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module sdkexample\n\ngo 1.26\n\nrequire github.com/brisk-faas/brisk v0.0.0-00010101000000-000000000000\n\nreplace github.com/brisk-faas/brisk => " + repo + "\n"
	for name, data := range map[string]string{"go.mod": gomod, "main.go": sdkProgram} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	gocmd("build", "-o", "sdkexample", ".")
	for _, dep := range strings.Fields(gocmd("list", "-deps", ".")) {
		if strings.Contains(dep, "grpc") || strings.Contains(dep, "protobuf") {
			t.Fatalf("the SDK links %s", dep)
		}
	}
	c := newCluster(t)
	c.up(t)
	cmd := exec.Command(filepath.Join(dir, "sdkexample"))
	cmd.Env = append(os.Environ(), c.env()...) // BRISK_ADMIN, BRISK_INVOKE, BRISK_TOKEN_FILE: as the CLI's
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("the SDK program: %v\n%s", err, out)
	}
}
