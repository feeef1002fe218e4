package cli

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// withConfigFile gives c a --config flag: a YAML (or JSON) file whose keys
// are c's flag names and whose values are what the flags would be given,
//
//	placement: ch-rlu
//	scaling-mode: dual
//	keep-alive-policy: gd
//	tls-san: [brisk.example, 10.0.0.5]
//
// Flags given on the command line win over the file.
func withConfigFile(c *cobra.Command) {
	var path string
	c.Flags().StringVar(&path, "config", "", "read settings from this YAML file: keys are this command's flag names (placement: ch-rlu); flags on the command line win")
	prev := c.PreRunE
	c.PreRunE = func(c *cobra.Command, args []string) error {
		if path != "" {
			if err := applyConfigFile(c.Flags(), path); err != nil {
				return usageError{err}
			}
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

func applyConfigFile(fl *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var settings map[string]any
	if err := yaml.Unmarshal(data, &settings); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f := fl.Lookup(k)
		if f == nil || k == "config" {
			return fmt.Errorf("--config %s: %q is not a setting of this command (its keys are flag names, as in --help)", path, k)
		}
		if f.Changed {
			continue
		}
		vals := []any{settings[k]}
		if list, ok := settings[k].([]any); ok {
			vals = list
		}
		for _, v := range vals {
			s := fmt.Sprint(v)
			if v == nil {
				s = ""
			}
			if err := f.Value.Set(strings.TrimSpace(s)); err != nil {
				return fmt.Errorf("--config %s: %s: %w", path, k, err)
			}
		}
	}
	return nil
}
