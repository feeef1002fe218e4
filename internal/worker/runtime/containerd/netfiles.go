package containerd

import (
	"net/netip"
	"os"
	"path/filepath"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/brisk-faas/brisk/internal/worker/netpool"
)

// A sandbox's /etc/resolv.conf names the network pool's DNS forwarder and
// its /etc/hosts has localhost, whatever its image carries there (as Docker
// and Kubernetes bind their own over the image's). Both are the same for
// every sandbox of the runtime: written once under the state directory
// and bound read-only into each.

const netDir = "net"

// writeNetFiles writes the files netMounts binds.
func writeNetFiles(stateDir string, pool *netpool.Pool) error {
	dir := filepath.Join(stateDir, netDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{"hosts": netpool.HostsFile(netip.Addr{}, "")}
	if rc := pool.ResolvConf(); rc != "" {
		files["resolv.conf"] = rc
	} else if err := os.Remove(filepath.Join(dir, "resolv.conf")); err != nil && !os.IsNotExist(err) {
		return err
	}
	for name, data := range files {
		tmp := filepath.Join(dir, name+".tmp")
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// netMounts binds the files writeNetFiles wrote.
func netMounts(stateDir string, pool *netpool.Pool) []specs.Mount {
	bind := func(name string) specs.Mount {
		return specs.Mount{Destination: "/etc/" + name, Type: "bind", Source: filepath.Join(stateDir, netDir, name),
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
	}
	m := []specs.Mount{bind("hosts")}
	if pool.ResolvConf() != "" {
		m = append(m, bind("resolv.conf"))
	}
	return m
}
