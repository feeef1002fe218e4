package runtimetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/pkg/codezip"
)

// NodeStandbySource is a Node function whose sandboxes say which process
// serves and what its module saw of the environment as it loaded, and
// log as they load and as they are called (the runtimes' standby tests).
const NodeStandbySource = `console.log('loading');
const loadedPort = process.env.PORT;
const fs = require('fs');
function status(field) {
  const line = fs.readFileSync('/proc/self/status', 'utf8').split('\n').find((l) => l.startsWith(field + ':'));
  return line ? line.split(/\s+/)[1] : '';
}
exports.handler = async (event) => {
  console.log('called ' + JSON.stringify(event));
  return {pid: process.pid, port: process.env.PORT, loadedPort, tpl: process.env.BRISK_TEMPLATE_FD || '',
    capEff: status('CapEff'), seccomp: status('Seccomp'), noNewPrivs: status('NoNewPrivs')};
};
`

// LangManager is a language manager that serves one archive of files, as
// the control plane would, and that archive's digest. Its directory is in
// the system's temporary directory, 0755, so that a sandbox's user reaches
// the code on the host's file system where the runtime does not bind it
// (t.TempDir is 0700). It skips the test without the interpreter lang
// names.
func LangManager(t testing.TB, language string, files map[string]string) (*lang.Manager, string) {
	t.Helper()
	zipped := map[string][]byte{}
	for p, src := range files {
		zipped[p] = []byte(src)
	}
	data, err := codezip.ZipFiles(zipped)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "brisk-lang-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	digest := codezip.Digest(data)
	m, err := lang.New(lang.Config{Dir: dir, Fetch: func(_ context.Context, d string) ([]byte, error) {
		if d != digest {
			return nil, fmt.Errorf("no archive %s", d)
		}
		return data, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Interpreter(language) == "" {
		t.Skip("no " + language + " interpreter")
	}
	return m, digest
}

// PostJSON posts body to the sandbox at addr and decodes its 200 reply
// into v; anything else fails the test.
func PostJSON(t testing.TB, addr, body string, v any) {
	t.Helper()
	resp, err := benchClient.Post("http://"+addr+"/", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, v) != nil {
		t.Fatalf("%s: %d %s", addr, resp.StatusCode, b)
	}
}
