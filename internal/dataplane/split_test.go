package dataplane

import (
	"io"
	"net/http"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

func traffic(ts ...*briskv1.TrafficTarget) func(*briskv1.FunctionSpec) {
	return func(s *briskv1.FunctionSpec) { s.Traffic = ts }
}

// Each round of 100 calls goes exactly by the percents, and a small share
// is spread over the round, not served in one run.
func TestSplitSlotsFollowPercents(t *testing.T) {
	s := newSplit("f", []*briskv1.TrafficTarget{{Function: "f_r3", Revision: 3, Percent: 90}, {Function: "f", Percent: 10}})
	if s == nil {
		t.Fatal("no split")
	}
	n, run, longest := map[string]int{}, 0, 0
	for _, name := range s.slots {
		n[name]++
		if name == "f" {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	if n["f_r3"] != 90 || n["f"] != 10 || longest != 1 {
		t.Fatalf("slots %v, longest run of the 10%% share %d", n, longest)
	}
	if newSplit("f", []*briskv1.TrafficTarget{{Function: "f", Percent: 100}}) != nil ||
		newSplit("f", []*briskv1.TrafficTarget{{Function: "f", Percent: 100}, {Function: "f_r2", Percent: 0}}) != nil {
		t.Fatal("a split that keeps every call with the function itself should be none")
	}
}

// A split function's calls reach each revision's sandboxes by the percents,
// and a target missing from the routing table leaves its share with the
// function.
func TestSplitRoutesCalls(t *testing.T) {
	d, srv := newTestDP(t, nil)
	cur, old := newSandbox(t, echo), newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{
			fnSpec("f", func(s *briskv1.FunctionSpec) { s.Revision = 5 },
				traffic(&briskv1.TrafficTarget{Function: "f_r3", Revision: 3, Percent: 75}, &briskv1.TrafficTarget{Function: "f", Percent: 25})),
			fnSpec("f_r3", func(s *briskv1.FunctionSpec) { s.Revision = 3 }),
		},
		Added: []*briskv1.Endpoint{ep("f", "sb-cur", cur), ep("f_r3", "sb-old", old)},
	})
	count := func(calls int) map[string]int {
		got := map[string]int{}
		for range calls {
			resp, err := http.Post(srv.URL+"/function/f", "text/plain", nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got[resp.Header.Get("X-Brisk-Sandbox")]++
		}
		return got
	}
	if got := count(200); got["sb-old"] != 150 || got["sb-cur"] != 50 {
		t.Fatalf("200 calls at 75/25: %v", got)
	}
	// A revision function is reached only through its function's split
	// (its token rule and weights): named directly, it is not there.
	for _, url := range []string{"/function/f_r3", "/async-function/f_r3", "/2015-03-31/functions/f_r3/invocations"} {
		resp, err := http.Post(srv.URL+url, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusNotImplemented {
			t.Fatalf("direct call %s: %d (sandbox %q), want 404", url, resp.StatusCode, resp.Header.Get("X-Brisk-Sandbox"))
		}
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/", nil)
	req.Host = "f_r3.example.com"
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("Host-routed call to f_r3: %v %v, want 404", resp, err)
	}
	// The revision function goes: its share stays with f.
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"f_r3"}})
	if got := count(20); got["sb-cur"] != 20 {
		t.Fatalf("calls with the split's target gone: %v", got)
	}
	// The split goes: all to f.
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("f", func(s *briskv1.FunctionSpec) { s.Revision = 6 })}})
	if d.lookup("f").set.Load().Conf.split != nil {
		t.Fatal("split kept after an update without one")
	}
}

// A call queued on a revision when the split ends is served by the
// function the caller named, not answered "deleted".
func TestSplitEndedWhileQueued(t *testing.T) {
	d, srv := newTestDP(t, nil)
	cur := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{
			fnSpec("f", func(s *briskv1.FunctionSpec) { s.Revision = 5 },
				traffic(&briskv1.TrafficTarget{Function: "f_r3", Revision: 3, Percent: 100})),
			fnSpec("f_r3", func(s *briskv1.FunctionSpec) { s.Revision = 3 }),
		},
		Added: []*briskv1.Endpoint{ep("f", "sb-cur", cur)},
	})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/f", nil)
	done := callInBackground(t, req)
	waitFor(t, "the call queued on f_r3", func() bool { return d.queued("f_r3") == 1 })
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"f_r3"},
		Functions: []*briskv1.FunctionSpec{fnSpec("f", func(s *briskv1.FunctionSpec) { s.Revision = 5 })}})
	resp := <-done
	if resp == nil || resp.StatusCode != 200 || resp.Header.Get("X-Brisk-Sandbox") != "sb-cur" {
		t.Fatalf("call queued when the split ended: %v", resp)
	}
}

// callInBackground sends req and delivers its response, body read and
// closed (nil on a transport error, reported).
func callInBackground(t *testing.T, req *http.Request) <-chan *http.Response {
	done := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			done <- nil
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp
	}()
	return done
}
