package client

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/brisk-faas/brisk/pkg/api"
)

// Environment variables FromEnv reads, the brisk CLI's too.
const (
	EnvAdmin     = "BRISK_ADMIN"      // the admin API's address
	EnvInvoke    = "BRISK_INVOKE"     // a data plane's address
	EnvToken     = "BRISK_TOKEN"      // an API token
	EnvTokenFile = "BRISK_TOKEN_FILE" // a file holding one
	EnvCACert    = "BRISK_CA_CERT"    // a PEM CA certificate to trust for https://
	EnvDataDir   = "BRISK_DATA_DIR"   // a local cluster's data dir
)

// Default addresses: those of `brisk up`.
const (
	DefaultAdmin  = "127.0.0.1:9090"
	DefaultInvoke = "127.0.0.1:8080"
)

// DefaultDataDir is where `brisk up` keeps its state: $BRISK_DATA_DIR, or
// ~/.brisk.
func DefaultDataDir() string {
	if d := os.Getenv(EnvDataDir); d != "" {
		return d
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".brisk")
	}
	return ".brisk"
}

// DefaultTokenFile is the token file the CLI reads: $BRISK_TOKEN_FILE, or
// the admin token `brisk up` writes to its data dir.
func DefaultTokenFile() string {
	return cmp.Or(os.Getenv(EnvTokenFile), filepath.Join(DefaultDataDir(), api.AdminTokenFile))
}

// FromEnv returns a client configured as the brisk CLI is without flags:
// addresses from $BRISK_ADMIN and $BRISK_INVOKE (default: brisk up's), the
// token from $BRISK_TOKEN or the token file (DefaultTokenFile; none is no
// error: a cluster without tokens needs none), and $BRISK_CA_CERT trusted
// for https:// URLs.
func FromEnv() (*Client, error) {
	c := New(cmp.Or(os.Getenv(EnvAdmin), DefaultAdmin), cmp.Or(os.Getenv(EnvInvoke), DefaultInvoke))
	c.Token = os.Getenv(EnvToken)
	if c.Token == "" {
		path := DefaultTokenFile()
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			c.Token = strings.TrimSpace(string(b))
		case os.Getenv(EnvTokenFile) != "": // named, so it must be there
			return nil, fmt.Errorf("%s: %w", EnvTokenFile, err)
		}
	}
	if ca := os.Getenv(EnvCACert); ca != "" {
		if err := c.TrustCAFile(ca); err != nil {
			return nil, fmt.Errorf("%s: %w", EnvCACert, err)
		}
	}
	return c, nil
}
