package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
)

// HTTPConfig is `brisk bench http`: the warm benchmark's open-loop
// generator pointed at any HTTP endpoint, with nothing registered or
// started. It is how brisk is measured side by side with another platform
// (the same generator, the same metrics) and how a bare server is measured.
type HTTPConfig struct {
	// URL of every call; "{i}" is replaced by the function's index.
	URL string
	// Host, when set, is the Host header ("{i}" replaced as in URL): the
	// function's name on platforms that route by host.
	Host string
	// Header is sent with every call (after the generator's own headers).
	Header    http.Header
	Functions int // calls go round-robin over functions 0..Functions-1; default 1
	Rate      float64
	// Closed, instead of Rate: this many closed-loop callers (saturation
	// throughput, as bench warm --closed).
	Closed   int
	Duration time.Duration
	// Warmup is the unmeasured calls' span before the measurement (0:
	// none, as a run where every call must reach a fresh function needs).
	Warmup time.Duration
	ExecMs int
}

// HTTPSummary is summary.json of bench http.
type HTTPSummary struct {
	Command string `json:"command"`
	Target  string `json:"target"` // the URL template
	Validity
	workload.Summary
	CPUPerCallUs float64        `json:"cpu_per_call_us"`
	Config       HTTPConfigJSON `json:"config"`
	Host         HostInfo       `json:"host"`
}

// HTTPConfigJSON records the run's parameters.
type HTTPConfigJSON struct {
	URL       string  `json:"url"`
	Host      string  `json:"host,omitempty"`
	Functions int     `json:"functions"`
	Rate      float64 `json:"rate,omitempty"`
	Closed    int     `json:"closed_callers,omitempty"`
	DurationS float64 `json:"duration_s"`
	WarmupS   float64 `json:"warmup_s"`
	ExecMs    int     `json:"exec_ms"`
	H2C       bool    `json:"h2c"`
}

// ValidateHTTP checks an HTTPConfig before anything is sent.
func ValidateHTTP(cfg *HTTPConfig) error {
	u, err := url.Parse(strings.ReplaceAll(cfg.URL, "{i}", "0"))
	switch {
	case cfg.URL == "":
		return errors.New("--url is required")
	case err != nil:
		return fmt.Errorf("--url %q: %w", cfg.URL, err)
	case u.Scheme != "http" || u.Host == "":
		return fmt.Errorf("--url %q: want http://host:port/path", cfg.URL)
	case strings.ContainsAny(cfg.Host, " /\r\n"):
		return fmt.Errorf("--host %q: not a host name", cfg.Host)
	case cfg.Rate != 0 && cfg.Closed != 0:
		return errors.New("--rate and --closed exclude each other: open loop or closed loop")
	case cfg.Rate < 0 || cfg.Closed < 0 || cfg.Rate+float64(cfg.Closed) == 0 || cfg.Duration <= 0:
		return fmt.Errorf("a positive --rate (or --closed) and --duration are required (got %g, %d, %s)", cfg.Rate, cfg.Closed, cfg.Duration)
	case cfg.Functions < 1 || cfg.ExecMs < 0 || cfg.Warmup < 0:
		return errors.New("--functions must be positive, --exec-ms and --warmup not negative")
	}
	return nil
}

// HTTP runs bench http.
func HTTP(ctx context.Context, o Options, cfg HTTPConfig) (*HTTPSummary, string, error) {
	if err := ValidateHTTP(&cfg); err != nil {
		return nil, "", fmt.Errorf("bench http: %w", err)
	}
	host := hostInfo()
	names := make([]string, cfg.Functions)
	targets := make(map[string]loadgen.Target, cfg.Functions)
	for i := range names {
		n := strconv.Itoa(i)
		names[i] = n
		targets[n] = loadgen.Target{URL: strings.ReplaceAll(cfg.URL, "{i}", n), Host: strings.ReplaceAll(cfg.Host, "{i}", n)}
	}
	inv := &loadgen.HTTPInvoker{Client: loadgen.NewHTTPClient(o.HTTP), Header: cfg.Header,
		Route: func(c *loadgen.Call) loadgen.Target { return targets[c.Function] }}
	ld := load{rate: cfg.Rate, closed: cfg.Closed, names: names, execMs: cfg.ExecMs}
	cpu0 := processCPU()
	recs, err := ld.send(ctx, &o, "http  ", inv, cfg.Warmup, cfg.Duration)
	if err != nil {
		return nil, "", err
	}
	out := &HTTPSummary{Command: "bench http", Target: cfg.URL, CPUPerCallUs: cpuPerCall(processCPU()-cpu0, len(recs)),
		Summary: workload.Summarize(recs), Config: HTTPConfigJSON{URL: cfg.URL, Host: cfg.Host, Functions: cfg.Functions,
			Rate: cfg.Rate, Closed: cfg.Closed, DurationS: cfg.Duration.Seconds(), WarmupS: cfg.Warmup.Seconds(), ExecMs: cfg.ExecMs, H2C: o.HTTP.H2C}}
	var verr error
	out.Validity, verr = validity(&o, recs)
	out.Host = host()
	err = writeOutputs(o.Out, out, map[string][]workload.Record{"invocations.csv": recs}, []plotSpec{{file: "latency_cdf.png",
		title: ld.title("calls"), xLabel: "response time (ms)", logX: true,
		series: []loadgen.Series{{Name: "http", Values: latencies(recs)}}}})
	text := formatLoad("http  ", &out.Summary, out.Validity, o.Force) + "\n" + out.Host.String()
	return out, text, errors.Join(verr, err)
}
