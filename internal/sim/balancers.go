package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
)

// LocalityBalancers are the papers' load balancers that choose a node for
// a function's calls by hashing (Sharding, CH-BL, CH-RLU) or by what the
// node holds (locality). In brisk they choose where sandboxes go, the
// placement policies of the same names; the data plane then balances among
// the function's sandboxes (docs/policies.md, "Why locality lives in
// placement").
var LocalityBalancers = []string{"sharding", "ch-bl", "ch-rlu", "locality"}

// balancerAliases are the short names the papers use.
var balancerAliases = map[string]string{"p2c": loadbalance.NamePowerOfTwo}

// ParseBalancers splits a comma-separated list of balancers (data-plane
// policies, their aliases, or locality balancers) and checks each.
func ParseBalancers(list string) ([]string, error) {
	names := strings.Split(list, ",")
	for _, n := range names {
		if !isBalancer(n) {
			return nil, fmt.Errorf("%q: want one of %s, p2c, or %s", n, strings.Join(loadbalance.Names(), ", "), strings.Join(LocalityBalancers, ", "))
		}
	}
	return names, nil
}

func isBalancer(n string) bool {
	_, alias := balancerAliases[n]
	return alias || slices.Contains(loadbalance.Names(), n) || slices.Contains(LocalityBalancers, n)
}

// SetBalancer makes cfg's run balance calls by name: a locality balancer
// becomes the placement, with the data plane's default policy among a
// function's sandboxes; a data-plane policy keeps cfg's placement.
func SetBalancer(cfg *Config, name string) error {
	if !isBalancer(name) {
		return fmt.Errorf("%q is not a load balancer", name)
	}
	if slices.Contains(LocalityBalancers, name) {
		cfg.Placement, cfg.LoadBalancing = name, loadbalance.NameLeastLoaded
		return nil
	}
	if a, ok := balancerAliases[name]; ok {
		name = a
	}
	cfg.LoadBalancing = name
	return nil
}
