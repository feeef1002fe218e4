package kubernetes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:%s"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func write(t *testing.T, port string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(p, []byte(strings.Replace(kubeconfig, "%s", port, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every part of brisk finds the cluster the same way: an explicit
// kubeconfig first; else, outside a Pod, $KUBECONFIG; nothing at all is a
// clear error, not a guess.
func TestConfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a Pod
	t.Setenv("HOME", t.TempDir())           // no ~/.kube/config
	explicit, env := write(t, "6443"), write(t, "7443")
	t.Setenv("KUBECONFIG", env)
	if cfg, err := Config(explicit); err != nil || cfg.Host != "https://127.0.0.1:6443" || cfg.BearerToken != "t" {
		t.Errorf("explicit: %+v, %v", cfg, err)
	}
	if cfg, err := Config(""); err != nil || cfg.Host != "https://127.0.0.1:7443" {
		t.Errorf("$KUBECONFIG: %+v, %v", cfg, err)
	}
	if _, err := Config(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing kubeconfig: %v, want an error naming it", err)
	}
	t.Setenv("KUBECONFIG", "")
	if _, err := Config(""); err == nil || !strings.Contains(err.Error(), "no cluster to talk to") {
		t.Errorf("no cluster: %v, want the clear error", err)
	}
}
