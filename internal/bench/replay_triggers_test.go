package bench

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
)

// triggerTrace writes a trace of three functions of azure_100, one of
// each kind, whose columns are seconds: an HTTP function called once a
// second, a timer firing once a second, and a queue function with three
// messages a second.
func triggerTrace(t *testing.T, columns int) (dir string, names map[string]string) {
	t.Helper()
	src := filepath.Join(moduleRoot(t), "traces", "azure_100")
	rows := readCSV(t, filepath.Join(src, workload.InvocationsFile))
	per := map[string]int{"http": 1, workload.TriggerTimer: 1, workload.TriggerQueue: 3}
	out := [][]string{append(rows[0][:4:4], make([]string, columns)...)}
	for i := range columns {
		out[0][4+i] = strconv.Itoa(i)
	}
	names = map[string]string{}
	for _, r := range rows[1:] {
		n, ok := per[r[3]]
		if !ok || names[r[3]] != "" {
			continue
		}
		row := append(r[:4:4], make([]string, columns)...)
		for c := range columns {
			row[4+c] = strconv.Itoa(n)
		}
		// Registered as trace-func-<row in the written trace>.
		names[r[3]] = workload.FunctionName(len(out) - 1)
		out = append(out, row)
	}
	if len(names) != len(per) {
		t.Fatalf("azure_100 lacks a function of each kind: %v", names)
	}
	dir = t.TempDir()
	w, err := os.Create(filepath.Join(dir, workload.InvocationsFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := csv.NewWriter(w).WriteAll(out); err != nil {
		t.Fatal(err)
	}
	w.Close()
	for _, n := range []string{workload.DurationsFile, workload.MemoryFile} {
		if err := os.WriteFile(filepath.Join(dir, n), must(os.ReadFile(filepath.Join(src, n))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, names
}

// replay --triggers on a local cluster: the timer's calls are its cron
// trigger's ticks and the queue function's are its NATS trigger's calls
// of the published messages; every one is counted, succeeds and is
// recorded with its own timing, and the HTTP function is called as before.
func TestReplayTriggersOnALocalCluster(t *testing.T) {
	ctx, c := asyncCluster(t)
	dir, names := triggerTrace(t, 6)
	o := Options{Out: t.TempDir(), Lateness: loadgen.Lateness{Late: time.Second, MaxFraction: 1}}
	cfg := ReplayConfig{TraceDir: dir, Minutes: 4, Warmup: 2, TimeScale: 1, Seed: 42, IAT: "equidistant", Granularity: "second",
		MaxRuntime: 20 * time.Millisecond, SkipMinutes: -1, Triggers: true}
	s, _, err := Replay(ctx, c, o, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Measured: 4 s of 1 HTTP call, 1 tick and 3 messages.
	if s.Requested != 4*(1+1+3) || s.Issued != s.Requested || s.Completed != s.Issued || s.Failed != 0 {
		t.Fatalf("requested %d issued %d completed %d failed %d, want %d each and no failure", s.Requested, s.Issued, s.Completed, s.Failed, 20)
	}
	recs, err := workload.ReadRecords(strings.NewReader(string(must(os.ReadFile(filepath.Join(o.Out, "invocations.csv"))))))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range recs {
		count[r.Function]++
		if !r.OK() || r.ResponseUs <= 0 || r.ActualUs <= 0 || r.Function == names[workload.TriggerTimer] && r.LatenessUs != 0 {
			t.Errorf("record %+v: want a succeeded call with its response and execution times", r)
		}
	}
	if count[names["http"]] != 6 || count[names[workload.TriggerTimer]] != 6 || count[names[workload.TriggerQueue]] != 18 {
		t.Errorf("records per function %v (functions %v), want 6 HTTP calls, 6 ticks, 18 messages", count, names)
	}
	// The triggers and the stream are gone.
	trs, err := c.Client.Triggers(ctx, "", "")
	if err != nil || len(trs) != 0 {
		t.Errorf("triggers after the replay: %v (%v)", trs, err)
	}
}
