package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// httpTLSFlags serve an HTTP listener over HTTPS.
type httpTLSFlags struct{ cert, key string }

func (f *httpTLSFlags) register(c *cobra.Command, what string) {
	c.Flags().StringVar(&f.cert, "tls-cert", "", "serve "+what+" over HTTPS with this PEM certificate (chain) file; needs --tls-key")
	c.Flags().StringVar(&f.key, "tls-key", "", "the PEM private key of --tls-cert")
}

// config loads the certificate (nil without --tls-cert).
func (f *httpTLSFlags) config() (*tls.Config, error) {
	if f.cert == "" && f.key == "" {
		return nil, nil
	}
	if f.cert == "" || f.key == "" {
		return nil, usageError{errors.New("--tls-cert and --tls-key go together")}
	}
	kp, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, usageError{fmt.Errorf("--tls-cert/--tls-key: %w", err)}
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{kp}, NextProtos: []string{"http/1.1"}}, nil
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
