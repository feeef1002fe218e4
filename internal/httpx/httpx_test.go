package httpx

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestHostLabel(t *testing.T) {
	for in, want := range map[string]string{
		"hello.brisk.local": "hello", "Hello.Example.COM": "hello", "hello:8080": "hello",
		"hello": "hello", "": "", "127.0.0.1:8080": "127", "[::1]:8080": "[", "HeLLo": "hello",
	} {
		if got := HostLabel(in); got != want {
			t.Errorf("HostLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHostLabels(t *testing.T) {
	for in, want := range map[string][2]string{
		"hello.team-a.example.com": {"hello", "hello.team-a"}, "Hello.Team-A.Example.COM:80": {"hello", "hello.team-a"},
		"hello.brisk": {"hello", "hello.brisk"}, "hello:8080": {"hello", "hello"}, "hello": {"hello", "hello"},
		"": {"", ""}, "127.0.0.1:8080": {"127", "127.0"},
	} {
		if first, two := HostLabels(in); first != want[0] || two != want[1] {
			t.Errorf("HostLabels(%q) = %q, %q, want %q, %q", in, first, two, want[0], want[1])
		}
	}
}

func TestNamesFunction(t *testing.T) {
	for in, want := range map[string]bool{"hello": true, "f-1": true, "": false, "localhost": false, "127": false, "[": false} {
		if got := NamesFunction(in); got != want {
			t.Errorf("NamesFunction(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestBufferPoolRecycles(t *testing.T) {
	var p BufferPool
	b := p.Get()
	if len(b) != copyBufSize {
		t.Fatalf("buffer of %d bytes, want %d", len(b), copyBufSize)
	}
	p.Put(b)
	p.Put(make([]byte, 10)) // too small: dropped, not handed out later
	if got := p.Get(); len(got) != copyBufSize {
		t.Fatalf("recycled buffer of %d bytes", len(got))
	}
}

func TestCodeCountersCacheOneCounterPerCode(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_requests_total"}, []string{"fn", "code"})
	m := &CodeCounters{Vec: vec, Label: "f"}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, code := range []int{200, 404, 200, 503} {
				m.Get(code).Inc()
			}
		}()
	}
	wg.Wait()
	if a, b := m.Get(200), m.Get(200); a != b {
		t.Fatal("two counters for one code")
	}
	for code, want := range map[string]float64{"200": 16, "404": 8, "503": 8} {
		if got := testutil.ToFloat64(vec.WithLabelValues("f", code)); got != want {
			t.Errorf("code %s: %v, want %v", code, got, want)
		}
	}
	if n := testutil.CollectAndCount(vec); n != 3 {
		t.Errorf("%d series, want 3", n)
	}
}
