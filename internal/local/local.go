// Package local runs a whole brisk cluster in one process — control plane,
// data plane and a worker daemon hosting one or many nodes — for `brisk up`
// and for benchmarks that bring their own cluster.
package local

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/credentials"

	"github.com/brisk-faas/brisk/internal/compat/openfaas"
	"github.com/brisk-faas/brisk/internal/controlplane"
	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/worker/runtimes"
)

// Config configures a one-process cluster. The data plane and the worker
// are pointed at the control plane's bound gRPC address, so every listen
// address may be 127.0.0.1:0.
type Config struct {
	ControlPlane controlplane.Config
	DataPlane    dataplane.Config
	Workers      runtimes.Workers
	Logger       *slog.Logger
	// InsecureNoTLS runs gRPC between the components in plaintext. By
	// default the control plane's CA (created in its data dir on the first
	// start) issues every component's certificate in-process: no join.
	InsecureNoTLS bool
}

// Cluster is a running one-process cluster.
type Cluster struct {
	cfg   Config
	cp    *controlplane.ControlPlane
	dp    *dataplane.DataPlane
	ready chan struct{}
	err   error
}

// New validates the config; it starts nothing.
func New(cfg Config) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ControlPlane.Logger == nil {
		cfg.ControlPlane.Logger = cfg.Logger.With("component", "controlplane")
	}
	if cfg.DataPlane.Logger == nil {
		cfg.DataPlane.Logger = cfg.Logger.With("component", "dataplane")
	}
	if !cfg.InsecureNoTLS && cfg.ControlPlane.CA == nil {
		ca, _, err := pki.LoadOrCreateCA(cfg.ControlPlane.DataDir)
		if err != nil {
			return nil, fmt.Errorf("cluster CA: %w", err)
		}
		cfg.ControlPlane.CA = ca
	}
	if ca := cfg.ControlPlane.CA; ca != nil {
		cfg.Workers.CA, cfg.Workers.Join = ca, nil
		if cfg.DataPlane.ID == "" {
			cfg.DataPlane.ID = "local"
		}
		id, err := ca.IssueStored(filepath.Join(cfg.ControlPlane.DataDir, "dataplane"), pki.KindDataPlane, []string{cfg.DataPlane.ID})
		if err != nil {
			return nil, fmt.Errorf("data plane certificate: %w", err)
		}
		cfg.DataPlane.Identity, cfg.DataPlane.Join = id, nil
	}
	cp, err := controlplane.New(cfg.ControlPlane)
	if err != nil {
		return nil, err
	}
	return &Cluster{cfg: cfg, cp: cp, ready: make(chan struct{})}, nil
}

// openFaaS is the OpenFaaS management API over this cluster's admin API,
// served on the data plane (faas-cli points at one gateway URL).
func (c *Cluster) openFaaS() http.Handler {
	base := "http://" + c.cp.AdminAddr()
	hc := &http.Client{Timeout: time.Minute}
	if c.cfg.ControlPlane.AdminTLS != nil {
		base = "https://" + c.cp.AdminAddr()
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if ca := c.cfg.ControlPlane.CA; ca != nil {
			tr.TLSClientConfig.RootCAs = ca.Pool()
		}
		hc.Transport = tr
	}
	return openfaas.New(base, hc, BuildInfo()).WithHostCheck(c.cfg.ControlPlane.AuthDisabled)
}

// BuildInfo is the brisk binary's version and commit, from the Go build
// information ("dev" and "unknown" when it has none).
func BuildInfo() openfaas.Info {
	info := openfaas.Info{Version: "dev", SHA: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			info.Version = v
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				info.SHA = s.Value
			}
		}
	}
	return info
}

// Credentials are gRPC client credentials for calling the control plane as
// data plane id (benchmarks that watch endpoints); nil without TLS.
func (c *Cluster) Credentials(id string) (credentials.TransportCredentials, error) {
	ca := c.cfg.ControlPlane.CA
	if ca == nil {
		return nil, nil
	}
	ident, err := ca.Issue(pki.KindDataPlane, []string{id}, nil, nil)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(ident.ClientTLS(pki.KindControlPlane, "")), nil
}

// Ready is closed once the admin API and the data plane listen.
func (c *Cluster) Ready() <-chan struct{} { return c.ready }

// AdminAddr is the admin API's bound address (after Ready).
func (c *Cluster) AdminAddr() string { return c.cp.AdminAddr() }

// InvokeAddr is the data plane's bound address (after Ready).
func (c *Cluster) InvokeAddr() string { return c.dp.Addr() }

// ControlPlane returns the control plane (status, tests).
func (c *Cluster) ControlPlane() *controlplane.ControlPlane { return c.cp }

// Run runs every component until ctx ends or one fails.
func (c *Cluster) Run(ctx context.Context) error {
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return c.cp.Run(ctx) })
	// The others start once the control plane listens: they need its
	// bound address, and their first connection then succeeds.
	eg.Go(func() error {
		select {
		case <-ctx.Done():
			return nil
		case <-c.cp.Ready():
		}
		dcfg := c.cfg.DataPlane
		dcfg.ControlPlane = c.cp.GRPCAddr()
		if dcfg.System == nil {
			dcfg.System = c.openFaaS()
		}
		dp, err := dataplane.New(dcfg)
		if err != nil {
			return err
		}
		c.dp = dp
		wk, emu, err := runtimes.BuildWorker(c.cfg.Workers, c.cp.GRPCAddr(), c.cfg.Logger)
		if err != nil {
			return err
		}
		eg.Go(func() error { return dp.Run(ctx) })
		eg.Go(func() error { return runtimes.RunWorker(ctx, wk, emu) })
		select {
		case <-ctx.Done():
		case <-dp.Ready():
			close(c.ready)
		}
		return nil
	})
	return eg.Wait()
}
