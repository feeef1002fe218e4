package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/pki"
)

// joinFlags are how a worker or data plane gets its certificate.
type joinFlags struct {
	token, tokenFile, caCert, caPin string
	insecure                        bool
}

func (f *joinFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.token, "join-token", os.Getenv("BRISK_JOIN_TOKEN"), "token to join the cluster with, traded at the first start for a certificate naming this node (env BRISK_JOIN_TOKEN; the control plane writes one to <data-dir>/join.token; not needed once --state-dir holds the certificate)")
	fl.StringVar(&f.tokenFile, "join-token-file", "", "file holding the join token (instead of --join-token)")
	fl.StringVar(&f.caCert, "ca-cert", "", "the cluster CA's certificate (<data-dir>/ca.crt of the control plane), to check the control plane with")
	fl.StringVar(&f.caPin, "ca-pin", "", "instead of --ca-cert: sha256:HEX of the CA's public key, which the control plane prints (brisk ca pin)")
	fl.BoolVar(&f.insecure, "insecure-no-tls", false, "talk to the control plane over plaintext gRPC, without a certificate (only with a control plane run with --insecure-no-tls; anyone who reaches the ports can then join or impersonate nodes)")
}

// joiner builds the Joiner (nil with --insecure-no-tls) keeping its files
// in dir.
func (f *joinFlags) joiner(cpAddr, dir string) (*pki.Joiner, error) {
	if f.insecure {
		return nil, nil
	}
	j := &pki.Joiner{ControlPlane: cpAddr, Token: f.token, CAPin: f.caPin, Dir: dir}
	if f.tokenFile != "" {
		tok, err := pki.ReadSecretFile(f.tokenFile)
		if err != nil {
			return nil, usageError{fmt.Errorf("--join-token-file: %w", err)}
		}
		j.Token = tok
	}
	if f.caCert != "" {
		b, err := os.ReadFile(f.caCert)
		if err != nil {
			return nil, usageError{fmt.Errorf("--ca-cert: %w", err)}
		}
		j.CACert = b
	}
	if j.CAPin != "" && !strings.HasPrefix(strings.ToLower(j.CAPin), "sha256:") {
		return nil, usageError{fmt.Errorf("--ca-pin %q: want sha256:HEX", j.CAPin)}
	}
	return j, nil
}

// httpTLSFlags serve an HTTP listener over HTTPS with a certificate the
// user supplies. prefix names the flags: "" (--tls-cert, --tls-key) or
// "invoke-" (--invoke-tls-cert, --invoke-tls-key under brisk up).
type httpTLSFlags struct{ prefix, cert, key string }

func (f *httpTLSFlags) register(c *cobra.Command, prefix, what string) {
	f.prefix = prefix
	c.Flags().StringVar(&f.cert, prefix+"tls-cert", "", "serve "+what+" over HTTPS with this PEM certificate (chain) file; needs --"+prefix+"tls-key")
	c.Flags().StringVar(&f.key, prefix+"tls-key", "", "the PEM private key of --"+prefix+"tls-cert")
}

// config loads the certificate (nil without --tls-cert).
func (f *httpTLSFlags) config() (*tls.Config, error) {
	if f.cert == "" && f.key == "" {
		return nil, nil
	}
	if f.cert == "" || f.key == "" {
		return nil, usageError{fmt.Errorf("--%[1]stls-cert and --%[1]stls-key go together", f.prefix)}
	}
	kp, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, usageError{fmt.Errorf("--%[1]stls-cert/--%[1]stls-key: %w", f.prefix, err)}
	}
	return pki.ListenerTLS(kp), nil
}

// generateTLS issues a listener certificate from ca for what listens on
// listen: SANs localhost, 127.0.0.1, ::1, the listen host (this host's
// name as well when it is unspecified, 0.0.0.0 or ::) and sans. Clients
// trust it through the CA's certificate (ca.crt, --ca-cert).
func generateTLS(ca *pki.CA, what, listen string, sans []string) (*tls.Config, error) {
	extra := slices.Clone(sans)
	if h, _, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
			if name, err := os.Hostname(); err == nil {
				extra = append(extra, name)
			}
		}
	}
	dns, ips := pki.HostSANs(listen, extra)
	cert, err := ca.IssueListener("brisk "+what, dns, ips)
	if err != nil {
		return nil, fmt.Errorf("%s certificate: %w", what, err)
	}
	cfg := pki.ListenerTLS(cert)
	cfg.RootCAs = ca.Pool() // for an HA follower proxying to its leader's admin API
	return cfg, nil
}

// genTLSFlags are --tls-generate, --tls-san and --tls-ca-dir of a data
// plane or gateway: they issue the listener's certificate from a cluster
// CA whose key they can read (on the control plane's host).
type genTLSFlags struct {
	generate bool
	sans     []string
	caDir    string
}

func (f *genTLSFlags) register(c *cobra.Command, what string) {
	fl := c.Flags()
	fl.BoolVar(&f.generate, "tls-generate", false, "serve "+what+" over HTTPS with a certificate issued at start from the cluster CA in --tls-ca-dir (needs its key, so only on the control plane's host; elsewhere use --tls-cert/--tls-key); clients trust the CA's ca.crt")
	fl.StringSliceVar(&f.sans, "tls-san", nil, "with --tls-generate: extra host names or IP addresses for the certificate (repeatable; localhost, 127.0.0.1, ::1 and the listen host are always in it)")
	fl.StringVar(&f.caDir, "tls-ca-dir", defaultDataDir(), "with --tls-generate: the directory holding ca.crt and ca.key (a control plane's --data-dir)")
}

// config is the listener's TLS: the user's certificate, else with
// --tls-generate one issued from the CA, else nil (plain HTTP).
func (f *genTLSFlags) config(user *httpTLSFlags, what, listen string) (*tls.Config, error) {
	cfg, err := user.config()
	if err != nil || cfg != nil {
		if cfg != nil && f.generate {
			return nil, usageError{errors.New("--tls-generate or --tls-cert/--tls-key, not both")}
		}
		return cfg, err
	}
	if !f.generate {
		if len(f.sans) > 0 {
			return nil, usageError{errors.New("--tls-san needs --tls-generate")}
		}
		return nil, nil
	}
	ca, err := pki.LoadCA(f.caDir)
	if err != nil {
		return nil, usageError{fmt.Errorf("--tls-generate needs the cluster CA's certificate and key in --tls-ca-dir %s (run this on the control plane's host, or give --tls-cert/--tls-key): %w", f.caDir, err)}
	}
	return generateTLS(ca, what, listen, f.sans)
}

func newCA(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "ca",
		Short: "The cluster CA: create one for HA replicas, print its pin",
		Long: `brisk's components authenticate each other with certificates of a cluster
CA (docs/security.md "Component identity"). A control plane run alone, and
brisk up, create it in --data-dir on the first start (ca.crt, ca.key).
The replicas of an HA control plane must share one: create it once with
'brisk ca init' and copy ca.crt and ca.key into every replica's --data-dir
before their first start.`,
	}
	var dir string
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create a cluster CA in --data-dir and print its pin",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			ca, err := pki.CreateCA(dir)
			if err != nil {
				return err
			}
			fmt.Printf("created %s and %s\nca pin: %s\n", filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile), ca.Pin())
			return nil
		},
	}
	pinCmd := &cobra.Command{
		Use:   "pin",
		Short: "Print the pin of the CA in --data-dir (for --ca-pin)",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			b, err := os.ReadFile(filepath.Join(dir, pki.CACertFile))
			if err != nil {
				return err
			}
			cert, err := pki.ParseCertPEM(b)
			if err != nil {
				return err
			}
			fmt.Println(pki.PinOf(cert))
			return nil
		},
	}
	for _, sc := range []*cobra.Command{initCmd, pinCmd} {
		sc.Flags().StringVar(&dir, "data-dir", defaultDataDir(), "the control plane's data directory")
	}
	c.AddCommand(initCmd, pinCmd)
	return c
}
