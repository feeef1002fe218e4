package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/credentials"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/controlplane"
	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/local"
	"github.com/brisk-faas/brisk/internal/worker/runtimes"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ClusterOptions say which cluster a benchmark runs against.
type ClusterOptions struct {
	// Local starts a one-process cluster; otherwise Admin and Invoke name
	// an existing one.
	Local         bool
	Admin, Invoke string
	Token         string // API token for an existing cluster (a local one makes its own)

	// Local cluster only.
	Runtime     string        // "emulated" or "process"
	Workers     int           // emulated nodes (process: 1)
	CreateDelay time.Duration // emulated sandbox creation delay
	// NodeCapacity per node; zero fields: for the emulated runtime 1000
	// cores and 4 TiB, so that a fake node's size never limits a benchmark
	// (4000 default sandboxes of 250m fit one), for the process runtime the
	// machine.
	NodeCapacity spec.Resources
	// Logger receives the local cluster's logs; nil discards them.
	Logger *slog.Logger
	// InsecureNoTLS: plaintext gRPC between the local cluster's components.
	InsecureNoTLS bool
	// EmergencySlots per node for dual-mode functions (local.Workers).
	EmergencySlots int
	// Async gives the local data plane an asynchronous-call queue: an
	// embedded NATS server with JetStream storing in the run's directory,
	// as brisk up embeds one. AsyncSyncAlways makes it fsync every write.
	Async, AsyncSyncAlways bool
}

// Emulated nodes' default capacity.
const (
	emulatedNodeMilliCPU = 1_000_000
	emulatedNodeMemoryMB = 4 << 20
)

// Cluster is the cluster under test.
type Cluster struct {
	Admin, Invoke string // host:port
	// GRPC is the control plane's gRPC address when known (a local cluster).
	GRPC string
	// GRPCCreds are the credentials of a watch on GRPC as a data plane (a
	// local cluster's CA issues them; nil: plaintext).
	GRPCCreds credentials.TransportCredentials
	Client    *client.Client
	// HTTP is a pooled client for admin calls made concurrently.
	HTTP  *http.Client
	local *local.Cluster
	stop  context.CancelFunc
	done  chan error
	dir   string
	// queue is a local cluster's asynchronous-call queue
	// (ClusterOptions.Async), on the connection nc.
	queue     *async.Queue
	nc        *nats.Conn
	closeNATS func()
}

// Open connects to the cluster, starting it first with Local, and waits
// until its admin API answers and, for a local one, every worker node is
// connected.
func Open(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	c := &Cluster{HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 256,
		IdleConnTimeout: 90 * time.Second}, Timeout: 2 * time.Minute}}
	if !o.Local {
		c.Admin, c.Invoke = o.Admin, o.Invoke
		c.Client = client.New(c.Admin, c.Invoke)
		c.Client.HTTP = c.HTTP
		c.Client.Token = o.Token
		if _, err := c.Client.Status(ctx); err != nil {
			return nil, fmt.Errorf("cluster at %s: %w (start one, or pass --local)", o.Admin, err)
		}
		return c, nil
	}
	if err := c.startLocal(ctx, o); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startLocal(ctx context.Context, o ClusterOptions) error {
	if o.Runtime == "" {
		o.Runtime = "emulated"
	}
	nodes := max(o.Workers, 1)
	capacity := o.NodeCapacity
	if o.Runtime == "emulated" {
		if capacity.MilliCPU == 0 {
			capacity.MilliCPU = emulatedNodeMilliCPU
		}
		if capacity.MemoryMB == 0 {
			capacity.MemoryMB = emulatedNodeMemoryMB
		}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, err := os.MkdirTemp("", "brisk-bench-")
	if err != nil {
		return err
	}
	c.dir = dir
	if o.Async {
		if err := c.openQueue(ctx, filepath.Join(dir, "nats"), o.AsyncSyncAlways, log.With("component", "async")); err != nil {
			return err
		}
	}
	cl, err := local.New(local.Config{
		ControlPlane: controlplane.Config{DataDir: filepath.Join(dir, "cp"), AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
			Async: c.queue, Logger: log.With("component", "controlplane")},
		DataPlane: dataplane.Config{ID: "bench", Listen: "127.0.0.1:0", Async: c.queue, Logger: log.With("component", "dataplane")},
		Workers: runtimes.Workers{Runtime: o.Runtime, Nodes: nodes, NodeID: "bench", CreateDelay: o.CreateDelay,
			StateDir: filepath.Join(dir, "worker"), Capacity: capacity, StopOnExit: true, EmergencySlots: o.EmergencySlots},
		Logger:        log,
		InsecureNoTLS: o.InsecureNoTLS,
	})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.local, c.stop, c.done = cl, stop, make(chan error, 1)
	go func() { c.done <- cl.Run(runCtx) }()
	select {
	case <-cl.Ready():
	case err := <-c.done:
		c.done <- err
		return fmt.Errorf("local cluster: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	c.Admin, c.Invoke, c.GRPC = cl.AdminAddr(), cl.InvokeAddr(), cl.ControlPlane().GRPCAddr()
	if c.GRPCCreds, err = cl.Credentials("bench-scale-watch"); err != nil {
		return fmt.Errorf("local cluster: %w", err)
	}
	c.Client = client.New(c.Admin, c.Invoke)
	c.Client.HTTP = c.HTTP
	tok, err := admin.ReadAdminToken(filepath.Join(dir, "cp"))
	if err != nil {
		return fmt.Errorf("local cluster: %w", err)
	}
	c.Client.Token = tok
	return c.waitNodes(ctx, nodes, time.Minute)
}

// openQueue starts an embedded NATS server storing under dir and opens the
// queue on it, as brisk up does.
func (c *Cluster) openQueue(ctx context.Context, dir string, syncAlways bool, log *slog.Logger) error {
	srv, err := async.StartServer(async.ServerConfig{Dir: dir, SyncAlways: syncAlways})
	if err != nil {
		return fmt.Errorf("local cluster: %w", err)
	}
	nc, err := srv.Connect("brisk-bench")
	if err != nil {
		srv.Shutdown()
		return fmt.Errorf("local cluster: nats: %w", err)
	}
	c.nc, c.closeNATS = nc, func() { nc.Close(); srv.Shutdown() }
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if c.queue, err = async.Open(octx, nc, async.Config{Logger: log}); err != nil {
		return fmt.Errorf("local cluster: %w", err)
	}
	return nil
}

// pauseAsync stops a local cluster's queue from handing out calls (it
// pauses the JetStream consumers of the calls stream) for at most d; the
// returned func lets them resume and returns when they do. Only a local
// cluster's queue can be paused.
func (c *Cluster) pauseAsync(ctx context.Context, d time.Duration) (resume func(context.Context) (time.Time, error), err error) {
	if c.nc == nil {
		return nil, errors.New("only a --local cluster's queue can be paused")
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, async.CallsStream)
	if err != nil {
		return nil, err
	}
	var names []string
	lister := st.ConsumerNames(ctx)
	for n := range lister.Name() {
		names = append(names, n)
	}
	if err := lister.Err(); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("stream %s has no consumer", async.CallsStream)
	}
	pause := func(ctx context.Context, until time.Time) error {
		var errs []error
		for _, n := range names {
			if _, err := st.PauseConsumer(ctx, n, until); err != nil {
				errs = append(errs, fmt.Errorf("consumer %s: %w", n, err))
			}
		}
		return errors.Join(errs...)
	}
	if err := pause(ctx, time.Now().Add(d)); err != nil {
		_ = pause(context.WithoutCancel(ctx), time.Now().Add(resumeDelay))
		return nil, fmt.Errorf("pausing: %w", err)
	}
	// Resuming (PauseUntil cleared) does not wake a consumer whose pull
	// requests wait (nats-server 2.15: only the pause deadline's timer
	// signals); a deadline just ahead does.
	// Even so a waiting pull is sometimes not woken (the drain then stalls
	// until the pull expires): until a consumer has calls out, nudge again.
	return func(ctx context.Context) (time.Time, error) {
		var first time.Time
		for try := 0; try < 20; try++ {
			until := time.Now().Add(resumeDelay)
			if err := pause(ctx, until); err != nil {
				return time.Time{}, fmt.Errorf("resuming: %w", err)
			}
			if first.IsZero() {
				first = until
			}
			time.Sleep(time.Until(until) + 250*time.Millisecond)
			if delivering(ctx, st, names) {
				break
			}
		}
		return first, nil
	}, nil
}

// delivering reports whether a consumer hands out calls (or has none left).
func delivering(ctx context.Context, st jetstream.Stream, names []string) bool {
	for _, n := range names {
		c, err := st.Consumer(ctx, n)
		if err != nil {
			continue
		}
		info, err := c.Info(ctx)
		if err == nil && (info.NumAckPending > 0 || info.NumPending == 0) {
			return true
		}
	}
	return false
}

// resumeDelay is how far ahead a pause's new deadline is set to resume a
// consumer: beyond the update's round trip.
const resumeDelay = 20 * time.Millisecond

// waitNodes polls the status until n nodes are connected.
func (c *Cluster) waitNodes(ctx context.Context, n int, timeout time.Duration) error {
	return poll(ctx, timeout, 20*time.Millisecond, func() (bool, error) {
		st, err := c.Client.Status(ctx)
		if err != nil {
			return false, err
		}
		up := 0
		for _, nd := range st.Nodes {
			if nd.Connected {
				up++
			}
		}
		return up >= n && len(st.DataPlanes) > 0, nil
	}, func() string { return fmt.Sprintf("%d worker nodes and a data plane to connect", n) })
}

// Close stops a local cluster and removes its files.
func (c *Cluster) Close() error {
	var err error
	if c.stop != nil {
		c.stop()
		select {
		case err = <-c.done:
		case <-time.After(30 * time.Second):
			err = errors.New("local cluster did not stop within 30s")
		}
	}
	if c.closeNATS != nil {
		c.closeNATS() // after the data plane, whose consumer uses it
	}
	if c.dir != "" {
		os.RemoveAll(c.dir)
	}
	return err
}

// IsLocal reports whether the cluster runs in this process.
func (c *Cluster) IsLocal() bool { return c.local != nil }

// poll calls cond until it reports true, fails, ctx ends or timeout passes;
// between calls it waits every. what describes the awaited state for the
// timeout error.
func poll(ctx context.Context, timeout, every time.Duration, cond func() (bool, error), what func() string) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// InvokeHeader is what calls of the cluster's functions carry: its token
// (functions need one unless deployed public).
func (c *Cluster) InvokeHeader() http.Header {
	if c.Client == nil || c.Client.Token == "" {
		return nil
	}
	return http.Header{"Authorization": {"Bearer " + c.Client.Token}}
}

// scrape fetches a Prometheus text endpoint.
func (c *Cluster) scrape(ctx context.Context, base string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.TrimPrefix(base, "http://")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	if c.Client != nil && c.Client.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Client.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s/metrics: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("scraping %s/metrics: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s/metrics: HTTP %d", base, resp.StatusCode)
	}
	return body, nil
}

// metricValues returns the samples of metric name in Prometheus text
// format, keyed by the value of label (the empty key for a sample without
// it). Histograms' _bucket/_sum/_count are separate names.
func metricValues(body []byte, name, label string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		key := ""
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			key = labelValue(rest[1:end], label)
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[key] += v
	}
	return out
}

func labelValue(labels, label string) string {
	for labels != "" {
		var kv string
		// Label values of brisk's metrics (function names, codes) hold no
		// commas or quotes.
		kv, labels, _ = strings.Cut(labels, ",")
		k, v, _ := strings.Cut(kv, "=")
		if strings.TrimSpace(k) == label {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return ""
}

// counter reads one unlabelled metric from the admin /metrics.
func (c *Cluster) counter(ctx context.Context, name string) (float64, error) {
	body, err := c.scrape(ctx, c.Admin)
	if err != nil {
		return 0, err
	}
	v, ok := metricValues(body, name, "")[""]
	if !ok {
		return 0, fmt.Errorf("admin /metrics has no %s", name)
	}
	return v, nil
}
