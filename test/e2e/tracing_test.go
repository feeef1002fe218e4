package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSink is an OTLP/HTTP trace receiver on loopback: it keeps the names
// and parents of the spans exported to it.
type otlpSink struct {
	mu    sync.Mutex
	spans map[string][]string // span name -> parent span ids (hex)
	ids   map[string]string   // span id -> name
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.spans[sp.GetName()] = append(s.spans[sp.GetName()], hexID(sp.GetParentSpanId()))
				s.ids[hexID(sp.GetSpanId())] = sp.GetName()
			}
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	b, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Write(b)
}

func hexID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// parentOf returns the name of the parent of the first span called name.
func (s *otlpSink) parentOf(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := s.spans[name]
	if len(ps) == 0 {
		return "", false
	}
	return s.ids[ps[0]], true
}

// A cluster given --otlp-endpoint exports each call's spans to the
// collector: a cold call's queueing, its sandbox's placement, creation and
// readiness, and the first byte, under one span per call; the control
// plane and the data plane export the same phases as Prometheus histograms.
func TestTracingAndPhaseMetrics(t *testing.T) {
	sink := &otlpSink{spans: map[string][]string{}, ids: map[string]string{}}
	col := httptest.NewServer(sink)
	defer col.Close()
	c := newCluster(t)
	c.up(t, "--otlp-endpoint", col.URL)
	c.mustBrisk(t, "fn", "deploy", "traced", "--builtin", "trace")
	if inv := c.invoke(t, "traced", ""); inv.status != 200 || !inv.cold {
		t.Fatalf("first call: %d cold=%v", inv.status, inv.cold)
	}
	want := map[string]string{"queue": "invoke traced", "cold start": "invoke traced", "first byte": "invoke traced",
		"placement": "cold start", "creation": "cold start", "readiness": "cold start"}
	eventually(t, 30*time.Second, "the call's spans exported", func() bool {
		for name := range want {
			if _, ok := sink.parentOf(name); !ok {
				return false
			}
		}
		return true
	})
	for name, parent := range want {
		if got, _ := sink.parentOf(name); got != parent {
			t.Errorf("span %q: parent %q, want %q", name, got, parent)
		}
	}

	metrics := func(url string) string {
		resp, err := c.hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	cp := metrics("http://" + c.admin + "/metrics")
	for _, phase := range []string{"creation", "readiness", "link"} {
		if !strings.Contains(cp, `brisk_controlplane_cold_start_phase_seconds_count{phase="`+phase+`"} 1`) {
			t.Errorf("control plane metrics lack one %s observation", phase)
		}
	}
	dp := metrics("http://" + c.invokeAddr + "/metrics")
	if !strings.Contains(dp, "brisk_dataplane_first_byte_seconds_count 1") || !strings.Contains(dp, "brisk_dataplane_queue_wait_seconds_count 1") {
		t.Errorf("data plane metrics lack the call's first byte or queue wait:\n%s", grepLines(dp, "first_byte_seconds_count", "queue_wait_seconds_count"))
	}
}

func grepLines(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}
