package cli

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/gateway"
)

func newGateway(g *globals) *cobra.Command {
	var listen, dataPlanes, metricsToken string
	var interval time.Duration
	var userTLS httpTLSFlags
	var genTLS genTLSFlags
	c := &cobra.Command{
		Use:   "gateway --dataplanes HOST:PORT,HOST:PORT...",
		Short: "Run a gateway that spreads functions over several data planes",
		Long: `Run the front door of a cluster with several data planes. Each function is
sent to one data plane, chosen by hashing its name over the healthy data
planes (rendezvous hashing), so all calls of a function share one queue,
one concurrency count and one set of autoscaling metrics. Requests name
their function as on a data plane: /function/NAME/... or a Host header
whose first label is NAME.

Data planes are probed with GET /healthz every --health-interval; one that
fails twice, or refuses a connection, gets no requests until a probe
succeeds again, and only its functions move. Every gateway given the same
--dataplanes (in any order) sends each function to the same data plane.

Clients reach it over plain HTTP/1.1 and h2c, or HTTPS (HTTP/1.1 only, TLS
1.2 or later) with --tls-cert and --tls-key or --tls-generate (a
certificate from the cluster CA in --tls-ca-dir, so only on the control
plane's host). The gateway calls the data planes over plain HTTP: keep that
hop on a private network.`,
		Example: `  brisk gateway --dataplanes 10.0.0.1:8080,10.0.0.2:8080 --listen 0.0.0.0:8088`,
		Args:    exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			var dps []string
			for _, d := range strings.Split(dataPlanes, ",") {
				if d = strings.TrimSpace(d); d != "" {
					dps = append(dps, d)
				}
			}
			if len(dps) == 0 {
				return usageError{fmt.Errorf("--dataplanes: give the data planes' invoke addresses, e.g. --dataplanes 10.0.0.1:8080,10.0.0.2:8080\nUsage: %s", c.UseLine())}
			}
			if interval <= 0 {
				return usageError{fmt.Errorf("--health-interval %s must be positive", interval)}
			}
			gwTLS, err := genTLS.config(&userTLS, "gateway", listen)
			if err != nil {
				return err
			}
			gw, err := gateway.New(gateway.Config{Listen: listen, TLS: gwTLS, DataPlanes: dps, HealthInterval: interval, MetricsToken: metricsToken,
				Logger: log.With("component", "gateway")})
			if err != nil {
				// Everything New checks comes from the flags.
				return usageError{err}
			}
			return gw.Run(c.Context())
		},
	}
	c.Flags().StringVar(&listen, "listen", gateway.DefaultListen, "HTTP listen address for invocations (HTTP/1.1 and h2c; over TLS, HTTP/1.1 only)")
	userTLS.register(c, "", "invocations")
	genTLS.register(c, "invocations")
	c.Flags().StringVar(&dataPlanes, "dataplanes", "", "comma-separated invoke addresses (host:port) of the data planes (required)")
	c.Flags().DurationVar(&interval, "health-interval", gateway.DefaultHealthInterval, "period of the GET /healthz probe of each data plane")
	c.Flags().StringVar(&metricsToken, "metrics-token", os.Getenv("BRISK_GATEWAY_METRICS_TOKEN"), "bearer token /metrics asks for (env BRISK_GATEWAY_METRICS_TOKEN; unset: loopback clients only)")
	return c
}
