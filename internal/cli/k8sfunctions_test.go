package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// brisk k8s functions refuses what it cannot run with as usage errors,
// before it talks to anything: no brisk token, an unreadable kubeconfig,
// a namespace that cannot be one.
func TestK8sFunctionsUsage(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	noToken := filepath.Join(dir, "none")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfig", filepath.Join(dir, "missing")}, "kubeconfig"},
		{[]string{"--kubeconfig", kubeconfig, "--token-file", noToken}, "no brisk token"},
		{[]string{"--kubeconfig", kubeconfig, "--token", "x", "--namespace", "Not_A_Label"}, "not a DNS label"},
		{[]string{"extra"}, "takes 0 argument"},
	} {
		g := &globals{tokenFile: noToken, logLevel: "info"}
		c := newK8sFunctions(g)
		c.PersistentFlags().StringVar(&g.token, "token", "", "")
		c.PersistentFlags().StringVar(&g.tokenFile, "token-file", noToken, "")
		c.SetArgs(tc.args)
		c.SilenceErrors, c.SilenceUsage = true, true
		err := c.Execute()
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want a usage error with %q", tc.args, err, tc.want)
		}
	}
}
