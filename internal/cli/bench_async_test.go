package cli

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchAsyncUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "async", "--backlog", "0"},
		{"bench", "async", "--accept-duration", "0s"},
		{"bench", "async", "--accept-duration", "soon"},
		{"bench", "async", "--light-calls", "-1"},
		{"bench", "async", "--concurrency", "0"},
		{"bench", "async", "--exec-ms", "-5"},
		{"bench", "async", "--clients", "0"},
		{"bench", "async", "extra"},
	} {
		root, _, _ := benchRoot(args...)
		err := root.Execute()
		var ue usageError
		if !errors.As(err, &ue) && !isFlagError(err) {
			t.Errorf("brisk %s: error %v, want a usage error", strings.Join(args, " "), err)
		}
	}
}

// TestBenchAsyncLocal runs the four phases at a tiny size on a local
// cluster with an embedded NATS server and checks what they count: every
// accepted call finished, every number measured.
func TestBenchAsyncLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	out := t.TempDir()
	root, stdout, stderr := benchRoot("bench", "async", "--local", "--accept-duration", "1s", "--accept-max", "3000", "--accept-rate", "400",
		"--light-calls", "20", "--backlog", "500", "--sync-duration", "1s", "--sync-warmup", "100ms", "--timeout", "1m", "--out", out)
	if err := root.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	type outcome struct{ Accepted, Succeeded, Failed, Unfinished int }
	type dist struct {
		N        int
		P50, P99 float64
	}
	var s struct {
		Accept struct {
			Sent         int     `json:"sent"`
			AcceptedPerS float64 `json:"accepted_per_s"`
			Latency      dist    `json:"accept_latency_ms"`
			Calls        outcome `json:"calls"`
		} `json:"accept"`
		Paced struct {
			Offered float64 `json:"offered_per_s"`
			Sent    int     `json:"sent"`
			Latency dist    `json:"accept_latency_ms"`
			Calls   outcome `json:"calls"`
		} `json:"paced"`
		Light struct {
			Overhead dist    `json:"accept_to_start_ms"`
			EndToEnd dist    `json:"submit_to_finish_ms"`
			NoTiming int     `json:"without_timing_header"`
			Calls    outcome `json:"calls"`
		} `json:"light"`
		Drain struct {
			Paused      bool    `json:"paused"`
			SubmitPerS  float64 `json:"submitted_per_s"`
			DrainedPerS float64 `json:"drained_per_s"`
			SubmitCPU   float64 `json:"submit_cpu_per_call_us"`
			CPU         float64 `json:"cpu_per_call_us"`
			Calls       outcome `json:"calls"`
		} `json:"drain"`
		Sync struct {
			Completed     int     `json:"completed"`
			ThroughputRPS float64 `json:"throughput_rps"`
			CPU           float64 `json:"cpu_per_call_us"`
		} `json:"sync"`
		DrainOverSync float64 `json:"drain_over_sync"`
		CPURatio      float64 `json:"cpu_ratio"`
		Goals         []struct {
			Name string `json:"name"`
		} `json:"goals"`
	}
	data, err := os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	all := func(what string, o outcome, want int) {
		if o.Accepted != want || o.Succeeded != want || o.Failed != 0 || o.Unfinished != 0 {
			t.Errorf("%s: %+v, want all %d succeeded", what, o, want)
		}
	}
	if s.Accept.Sent < 1 || s.Accept.Sent > 3000 || s.Accept.AcceptedPerS <= 0 || s.Accept.Latency.N != s.Accept.Sent || s.Accept.Latency.P99 <= 0 {
		t.Errorf("accept phase: %s", data)
	}
	all("accept", s.Accept.Calls, s.Accept.Sent)
	// 1 s at 400/s: 400 calls on schedule.
	if s.Paced.Offered != 400 || s.Paced.Sent != 400 || s.Paced.Latency.N != 400 || s.Paced.Latency.P99 <= 0 {
		t.Errorf("paced phase: %s", data)
	}
	all("paced", s.Paced.Calls, 400)
	all("light", s.Light.Calls, 20)
	all("backlog", s.Drain.Calls, 500)
	if s.Light.Overhead.N != 20 || s.Light.Overhead.P50 <= 0 || s.Light.EndToEnd.P50 < s.Light.Overhead.P50 || s.Light.NoTiming != 0 {
		t.Errorf("light phase: %s", data)
	}
	if !s.Drain.Paused || s.Drain.SubmitPerS <= 0 || s.Drain.DrainedPerS <= 0 || s.Drain.SubmitCPU <= 0 || s.Drain.CPU <= 0 {
		t.Errorf("drain phase: %s", data)
	}
	if s.Sync.Completed <= 0 || s.Sync.ThroughputRPS <= 0 || s.Sync.CPU <= 0 || s.DrainOverSync <= 0 || s.CPURatio <= 0 || len(s.Goals) != 5 {
		t.Errorf("sync phase and ratio: %s", data)
	}
	f, err := os.Open(filepath.Join(out, "calls.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + s.Accept.Sent + 400 + 20 + 500; len(rows) != want {
		t.Errorf("calls.csv: %d rows, want %d", len(rows), want)
	}
	for _, r := range rows[1:] {
		if r[2] != "succeeded" || r[6] == "" {
			t.Errorf("calls.csv row %v", r)
			break
		}
	}
	for _, want := range []string{"accept:", "paced:", "light:", "drain:", "sync:", "drain/sync:", "goals:"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
}

// brisk up --nats-listen on a fresh data dir makes the dir and the token
// (it failed: the token was written before anything made the dir), and
// reads the same token at the next start.
func TestNATSTokenOnAFreshDataDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fresh", "data", "nats.token")
	tok, err := natsToken(path)
	if err != nil || len(tok) != 64 {
		t.Fatalf("first start: token %q, %v", tok, err)
	}
	again, err := natsToken(path)
	if err != nil || again != tok {
		t.Fatalf("second start: %q, %v; want the first token", again, err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", st, err)
	}
}
