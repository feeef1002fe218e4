package bench

import (
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
)

// bench async on a local cluster with its embedded queue: every phase's
// calls are accepted and run, and calls.csv has a finished row for each.
func TestAsyncOnALocalCluster(t *testing.T) {
	ctx, c := asyncCluster(t)
	o := Options{Out: t.TempDir(), Lateness: loadgen.Lateness{Late: time.Second, MaxFraction: 1}}
	s, _, err := Async(ctx, c, o, AsyncConfig{Clients: 4, AcceptDuration: 300 * time.Millisecond, AcceptMax: 400, AcceptRate: 500,
		LightCalls: 5, LightGap: 5 * time.Millisecond, Backlog: 200, Concurrency: 8, SyncDuration: 300 * time.Millisecond,
		SyncWarmup: 100 * time.Millisecond, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, p, l, d := s.Accept.Calls, s.Paced.Calls, s.Light.Outcome, s.Drain.Calls
	if a.Accepted == 0 || a.Succeeded != a.Accepted || s.Accept.LatencyMs.N != a.Accepted {
		t.Errorf("accept phase: %+v, latencies %d", a, s.Accept.LatencyMs.N)
	}
	if p.Accepted != 150 || p.Succeeded != 150 {
		t.Errorf("paced phase (500/s for 300 ms): %+v", p)
	}
	if l.Accepted != 5 || l.Succeeded != 5 || s.Light.OverheadMs.N != 5 {
		t.Errorf("light phase: %+v, overheads %d", l, s.Light.OverheadMs.N)
	}
	if d.Accepted != 200 || d.Succeeded != 200 {
		t.Errorf("drain phase: %+v", d)
	}
	rows := readCSV(t, filepath.Join(o.Out, "calls.csv"))
	if want := 1 + a.Accepted + 150 + 5 + 200; len(rows) != want {
		t.Fatalf("calls.csv: %d rows, want %d", len(rows), want)
	}
	for _, r := range rows[1:] {
		if r[2] != "succeeded" || r[3] != "1" || r[4] == "" || r[5] == "" || r[6] == "" || r[7] == "" {
			t.Fatalf("calls.csv row %v", r)
		}
	}
}

// readCSV reads all of the CSV file at path.
func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// asyncCluster starts a one-process cluster (one emulated worker) with its
// embedded queue for the test, and a context bounding the test to 3 min.
func asyncCluster(t *testing.T) (context.Context, *Cluster) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c, err := Open(ctx, ClusterOptions{Local: true, Runtime: "emulated", Workers: 1, CreateDelay: 5 * time.Millisecond, Async: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return ctx, c
}
