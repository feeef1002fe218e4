package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/worker/netpool"
)

// netBenchFlags configure __netbench. The subnet, bridge and prefixes are
// the benchmark's own, so it never touches a worker's pool.
type netBenchFlags struct {
	sizes            string
	rounds           int
	bridge, subnet   string
	prefix, ipPrefix string
	skipIP           bool
}

// newNetBench is the hidden command that measures, in one run on this
// machine, what the network pool saves: concurrent endpoint creation through
// netlink, the same through the `ip` command line, and taking a pre-created
// endpoint from a pool. It needs root and cleans up everything it creates.
func newNetBench() *cobra.Command {
	f := &netBenchFlags{}
	c := &cobra.Command{
		Use:    "__netbench",
		Short:  "Measure network endpoint creation (netlink, ip) against taking one from the pool",
		Hidden: true,
		Args:   exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			sizes, err := parseSizes(f.sizes)
			if err != nil {
				return usageError{err}
			}
			if f.rounds < 1 {
				return usageError{fmt.Errorf("--rounds %d: want at least 1", f.rounds)}
			}
			subnet, err := netip.ParsePrefix(f.subnet)
			if err != nil {
				return usageError{fmt.Errorf("--subnet: %w", err)}
			}
			if os.Geteuid() != 0 {
				return errors.New("__netbench needs root (network namespaces, veths, mounts)")
			}
			nb := &netBench{f: f, sizes: sizes, subnet: subnet, out: c.OutOrStdout()}
			return nb.run(c.Context())
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.sizes, "sizes", "1,10,50,100", "concurrency levels, comma-separated")
	fl.IntVar(&f.rounds, "rounds", 3, "rounds per level; percentiles pool all rounds, totals are the median round")
	fl.StringVar(&f.bridge, "bridge", "nbbr0", "bridge the benchmark creates and removes")
	fl.StringVar(&f.subnet, "subnet", "10.215.0.0/16", "subnet the benchmark's endpoints use")
	fl.StringVar(&f.prefix, "prefix", "nb", "name prefix of the pool's endpoints")
	fl.StringVar(&f.ipPrefix, "ip-prefix", "nbip", "name prefix of the endpoints made with the ip command")
	fl.BoolVar(&f.skipIP, "skip-ip", false, "skip the ip command line comparison")
	return c
}

func parseSizes(s string) ([]int, error) {
	var sizes []int
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("--sizes %q: want comma-separated counts in [1, 1000]", s)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

type netBench struct {
	f      *netBenchFlags
	sizes  []int
	subnet netip.Prefix
	out    io.Writer
	rows   []benchRow
}

// benchRow is one line of the result table.
type benchRow struct {
	section  string
	n        int
	lat      []time.Duration // one per operation, all rounds
	totals   []time.Duration // wall time of each round
	teardown []time.Duration // wall time of each round's teardown, if measured
}

func (nb *netBench) poolConfig(size int) netpool.Config {
	return netpool.Config{Size: size, MaxReady: 2 * size, Bridge: nb.f.bridge, Subnet: nb.subnet, NamePrefix: nb.f.prefix}
}

func (nb *netBench) run(ctx context.Context) (err error) {
	maxN := slices.Max(nb.sizes)
	// Whatever happens, leave nothing behind: pools close themselves below;
	// this catches an interrupted run.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err = errors.Join(err,
			netpool.Cleanup(cctx, netpool.Config{Bridge: nb.f.bridge, Subnet: nb.subnet, NamePrefix: nb.f.ipPrefix}),
			netpool.Cleanup(cctx, nb.poolConfig(0)))
	}()

	// (a) and (b) share a Size-0 pool: every Take creates an endpoint on
	// demand, and its bridge serves the ip-made endpoints as well.
	p, err := netpool.New(nb.poolConfig(0))
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	for _, n := range nb.sizes {
		row, err := nb.createWithPool(ctx, p, n)
		if err != nil {
			return errors.Join(err, p.Close(context.WithoutCancel(ctx)))
		}
		nb.rows = append(nb.rows, row)
	}
	if !nb.f.skipIP {
		if _, err := exec.LookPath("ip"); err != nil {
			fmt.Fprintln(nb.out, "skipping the ip comparison: ip not found")
		} else {
			for _, n := range nb.sizes {
				row, err := nb.createWithIP(ctx, n)
				if err != nil {
					return errors.Join(err, p.Close(context.WithoutCancel(ctx)))
				}
				nb.rows = append(nb.rows, row)
			}
		}
	}
	if err := p.Close(ctx); err != nil {
		return err
	}

	// (c) a pool pre-filled with the largest level.
	p, err = netpool.New(nb.poolConfig(maxN))
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := p.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(nb.out, "pre-filled a pool of %d in %v\n", maxN, time.Since(t0).Round(time.Millisecond))
	for _, n := range nb.sizes {
		row, err := nb.takeFromPool(ctx, p, n, maxN)
		if err != nil {
			return errors.Join(err, p.Close(context.WithoutCancel(ctx)))
		}
		nb.rows = append(nb.rows, row)
	}
	t0 = time.Now()
	if err := p.Close(ctx); err != nil {
		return err
	}
	fmt.Fprintf(nb.out, "closed the pool (%d endpoints destroyed) in %v\n\n", maxN, time.Since(t0).Round(time.Millisecond))
	nb.print()
	return nil
}

// concurrently starts n goroutines at once and returns each one's latency
// and the wall time until the last finished.
func concurrently(n int, op func(i int) error) (lat []time.Duration, total time.Duration, err error) {
	lat = make([]time.Duration, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			errs[i] = op(i)
			lat[i] = time.Since(t0)
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return lat, time.Since(t0), errors.Join(errs...)
}

// createWithPool is (a): n endpoints created at once through netlink (Takes
// on an empty Size-0 pool), then released, which destroys them.
func (nb *netBench) createWithPool(ctx context.Context, p *netpool.Pool, n int) (benchRow, error) {
	row := benchRow{section: "create (netlink)", n: n}
	for range nb.f.rounds {
		eps := make([]*netpool.Endpoint, n)
		lat, total, err := concurrently(n, func(i int) error {
			var err error
			eps[i], err = p.Take(ctx)
			return err
		})
		destroyed := p.Stats().Destroyed
		t0 := time.Now()
		for _, ep := range eps {
			if ep != nil {
				p.Release(ep)
			}
		}
		if err != nil {
			return row, err
		}
		if err := waitFor(ctx, func() bool { return p.Stats().Destroyed >= destroyed+int64(n) }); err != nil {
			return row, fmt.Errorf("waiting for teardown: %w", err)
		}
		row.lat = append(row.lat, lat...)
		row.totals = append(row.totals, total)
		row.teardown = append(row.teardown, time.Since(t0))
	}
	return row, nil
}

// createWithIP is (b): the same endpoints made by running iproute2, as the
// PCPM paper measured; only this benchmark ever runs ip.
func (nb *netBench) createWithIP(ctx context.Context, n int) (benchRow, error) {
	row := benchRow{section: "create (ip command)", n: n}
	gw := nb.subnet.Masked().Addr().Next()
	bits := strconv.Itoa(nb.subnet.Bits())
	// Addresses from offset 1000 up stay clear of the pool's, which start at 2.
	addr := func(i int) netip.Addr {
		b := gw.As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(999+i)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	if last := addr(n - 1); !nb.subnet.Contains(last) {
		return row, usageError{fmt.Errorf("--subnet %v is too small for %d ip-made endpoints from offset 1000", nb.subnet, n)}
	}
	for range nb.f.rounds {
		names := make([]string, n)
		lat, total, err := concurrently(n, func(i int) error {
			name := fmt.Sprintf("%s-%d", nb.f.ipPrefix, 1000+i)
			names[i] = name
			peer := name + "p"
			for _, args := range [][]string{
				{"netns", "add", name},
				{"link", "add", name, "type", "veth", "peer", "name", peer},
				{"link", "set", peer, "netns", name},
				{"link", "set", name, "master", nb.f.bridge, "up"},
				{"-n", name, "link", "set", "lo", "up"},
				{"-n", name, "addr", "add", addr(i).String() + "/" + bits, "dev", peer},
				{"-n", name, "link", "set", peer, "up"},
				{"-n", name, "route", "add", "default", "via", gw.String()},
			} {
				if err := runIP(ctx, args...); err != nil {
					return err
				}
			}
			return nil
		})
		t0 := time.Now()
		_, _, terr := concurrently(n, func(i int) error {
			return errors.Join(runIP(ctx, "link", "del", names[i]), runIP(ctx, "netns", "del", names[i]))
		})
		if err := errors.Join(err, terr); err != nil {
			return row, err
		}
		row.lat = append(row.lat, lat...)
		row.totals = append(row.totals, total)
		row.teardown = append(row.teardown, time.Since(t0))
	}
	return row, nil
}

func runIP(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// takeFromPool is (c): n takers at once on a pool pre-filled with size
// endpoints; between rounds every endpoint is released and recycled.
func (nb *netBench) takeFromPool(ctx context.Context, p *netpool.Pool, n, size int) (benchRow, error) {
	row := benchRow{section: "take (pool)", n: n}
	for range nb.f.rounds {
		if err := waitFor(ctx, func() bool { s := p.Stats(); return s.Ready >= int64(size) && s.InUse == 0 }); err != nil {
			return row, fmt.Errorf("waiting for a full pool: %w", err)
		}
		before := p.Stats()
		eps := make([]*netpool.Endpoint, n)
		lat, total, err := concurrently(n, func(i int) error {
			var err error
			eps[i], err = p.Take(ctx)
			return err
		})
		for _, ep := range eps {
			if ep != nil {
				p.Release(ep)
			}
		}
		if err != nil {
			return row, err
		}
		if s := p.Stats(); s.CreatedOnDemand != before.CreatedOnDemand {
			return row, fmt.Errorf("%d of %d takes missed the pool", s.CreatedOnDemand-before.CreatedOnDemand, n)
		}
		row.lat = append(row.lat, lat...)
		row.totals = append(row.totals, total)
	}
	return row, nil
}

// waitFor polls cond every millisecond for up to two minutes.
func waitFor(ctx context.Context, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

func (nb *netBench) print() {
	tw := tabwriter.NewWriter(nb.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "what\tN\tp50\tp99\ttotal\tteardown\t\n")
	for _, r := range nb.rows {
		td := "-"
		if len(r.teardown) > 0 {
			td = fmtDur(median(r.teardown))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", r.section, r.n,
			fmtDur(quantile(r.lat, 0.50)), fmtDur(quantile(r.lat, 0.99)), fmtDur(median(r.totals)), td)
	}
	tw.Flush()
	fmt.Fprintf(nb.out, "\np50/p99: per operation over %d rounds; total and teardown: wall time of the median round for all N.\n", nb.f.rounds)
}

// quantile is the nearest-rank q-quantile.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(d []time.Duration) time.Duration { return quantile(d, 0.5) }

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d.Nanoseconds())/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d.Nanoseconds())/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
