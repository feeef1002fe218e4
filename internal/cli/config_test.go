package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestConfigFile(t *testing.T) {
	fl := pflag.NewFlagSet("up", pflag.ContinueOnError)
	placement := fl.String("placement", "kubernetes", "")
	grace := fl.Duration("node-grace", 0, "")
	sans := fl.StringSlice("tls-san", nil, "")
	maxSb := fl.Int("max-sandboxes", 0, "")
	admin := fl.String("admin", "127.0.0.1:9090", "")
	if err := fl.Parse([]string{"--admin", "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	err := applyConfigFile(fl, write("placement: ch-rlu\nnode-grace: 15s\ntls-san: [a.example, 10.0.0.5]\nadmin: 0.0.0.0:9\nmax-sandboxes: 1000000\n"))
	if *maxSb != 1_000_000 || !fl.Changed("placement") {
		t.Fatalf("max-sandboxes %d, placement changed %v", *maxSb, fl.Changed("placement"))
	}
	if err != nil || *placement != "ch-rlu" || grace.String() != "15s" || strings.Join(*sans, ",") != "a.example,10.0.0.5" {
		t.Fatalf("applied: %v placement %s grace %s sans %v", err, *placement, grace, *sans)
	}
	if *admin != "127.0.0.1:1" {
		t.Fatalf("admin %s: the command line must win over the file", *admin)
	}
	for in, want := range map[string]string{
		"placment: ch-rlu\n":   `"placment" is not a setting`,
		"node-grace: soon\n":   "node-grace",
		"placement: [ch-rlu\n": "c.yaml",
		"placement:\n":         "no value",
		"placement: [a, b]\n":  "not a list",
		"placement: {a: 1}\n":  "not map",
	} {
		fresh := pflag.NewFlagSet("up", pflag.ContinueOnError)
		fresh.String("placement", "kubernetes", "")
		fresh.Duration("node-grace", 0, "")
		if err := applyConfigFile(fresh, write(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one naming %q", in, err, want)
		}
	}
}
