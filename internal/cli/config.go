package cli

import (
	"fmt"
	"os"
	"slices"
	"strconv"
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
// Flags given on the command line win over the file. Values are YAML's:
// quote strings YAML would read as something else ("off", "yes").
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
			if !strings.Contains(f.Value.Type(), "Slice") && !strings.Contains(f.Value.Type(), "Array") {
				return fmt.Errorf("--config %s: %s takes one value, not a list", path, k)
			}
			vals = list
		}
		for _, v := range vals {
			var s string
			switch x := v.(type) {
			case nil:
				return fmt.Errorf("--config %s: %s has no value", path, k)
			case map[string]any, []any:
				return fmt.Errorf("--config %s: %s: want a value, not %T", path, k, v)
			case float64: // YAML numbers; %v would write 1e+06
				s = strconv.FormatFloat(x, 'f', -1, 64)
			default:
				s = fmt.Sprint(v)
			}
			// fl.Set, not Value.Set: the flag then counts as given, for
			// the commands' checks of which flags were given.
			if err := fl.Set(k, s); err != nil {
				return fmt.Errorf("--config %s: %s: %w", path, k, err)
			}
		}
	}
	return nil
}
