package netpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
)

// Cleanup removes every namespace and host link named <NamePrefix>-<n>, the
// bridge if a pool with this prefix created it, and the prefix's firewall
// tables (unless cfg.NoFirewall), as left by a worker that died without
// Close. A restarted worker calls it (Start does too, and replaces the
// tables instead of removing them) before making new endpoints. It must
// not run while a live Pool uses the prefix.
func Cleanup(ctx context.Context, cfg Config) error {
	err := cleanup(ctx, cfg, nil)
	if err == nil && !cfg.NoFirewall {
		err = removeFirewall(cfg.withDefaults().NamePrefix)
	}
	return err
}

// cleanup is Cleanup sparing the endpoints named in keep (adopted ones)
// and, when there are any, the bridge their host links are attached to.
func cleanup(ctx context.Context, cfg Config, keep map[string]bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	match := nameRE(cfg.NamePrefix)
	var errs []error

	links, err := retryDump(netlink.LinkList)
	if err != nil {
		return fmt.Errorf("netpool: cleanup: list links: %w", err)
	}
	// Links first: deleting a host veth takes its peer out of the namespace.
	for _, l := range links {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if a := l.Attrs(); match.MatchString(a.Name) && !keep[a.Name] {
			if err := deleteLink(a.Name); err != nil {
				errs = append(errs, fmt.Errorf("netpool: cleanup: delete link %s: %w", a.Name, err))
			}
		}
	}

	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("netpool: cleanup: %w", err))
	}
	for _, e := range entries {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !match.MatchString(e.Name()) || keep[e.Name()] {
			continue
		}
		path := filepath.Join(netnsDir, e.Name())
		if err := unmount(path); err != nil {
			errs = append(errs, fmt.Errorf("netpool: cleanup: %w", err))
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("netpool: cleanup: %w", err))
		}
	}

	// The alias says a pool with this prefix created the bridge; a bridge
	// someone else made is left alone.
	if br, err := netlink.LinkByName(cfg.Bridge); err == nil && br.Attrs().Alias == bridgeAlias(cfg.NamePrefix) && len(keep) == 0 {
		if err := deleteLink(cfg.Bridge); err != nil {
			errs = append(errs, fmt.Errorf("netpool: cleanup: delete bridge %s: %w", cfg.Bridge, err))
		}
	}
	return errors.Join(errs...)
}
