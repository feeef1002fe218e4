package keepalive

import (
	"testing"
	"time"
)

func TestHybridWindows(t *testing.T) {
	const fallback = 15 * time.Minute
	h := NewHybrid(HybridConfig{})
	// Unknown, then too few idle times: the fallback keep-alive.
	if w := h.Windows("f", fallback); w.Mode != "fallback" || w.Prewarm != 0 || w.KeepAlive != fallback {
		t.Fatalf("unknown: %+v", w)
	}
	for range 5 {
		h.Observe("f", 30*time.Minute+20*time.Second)
	}
	if w := h.Windows("f", fallback); w.Mode != "fallback" {
		t.Fatalf("5 idle times: %+v, want the fallback", w)
	}
	// A timer every 30 minutes: idle 30 min (bin 30) again and again.
	for range 45 {
		h.Observe("f", 30*time.Minute+20*time.Second)
	}
	w := h.Windows("f", fallback)
	if w.Mode != "histogram" || w.Prewarm != 27*time.Minute || w.KeepAlive != scale(31*time.Minute, 1.1)-27*time.Minute {
		t.Fatalf("every 30 min: %+v, want pre-warm 27 min (bin 30 less 10%%) and keep-alive to 34.1 min", w)
	}
	// Frequent calls (idle under a minute): never unloaded, kept to the tail.
	for range 50 {
		h.Observe("g", 20*time.Second)
	}
	h.Observe("g", 3*time.Minute+5*time.Second)
	if w := h.Windows("g", fallback); w.Mode != "histogram" || w.Prewarm != 0 || w.KeepAlive != scale(4*time.Minute, 1.1) {
		t.Fatalf("frequent: %+v, want no pre-warm and keep-alive to the 99th percentile's bin (4 min) + 10%%", w)
	}
	// Idle times spread evenly: not representative.
	for i := range 240 {
		h.Observe("u", time.Duration(i)*time.Minute)
	}
	if w := h.Windows("u", fallback); w.Mode != "fallback" {
		t.Fatalf("uniform idle times: %+v, want the fallback (CV below 2)", w)
	}
	// Mostly beyond the 4-hour range: forecast from the mean.
	for range 12 {
		h.Observe("d", 6*time.Hour)
	}
	h.Observe("d", time.Minute)
	if w := h.Windows("d", fallback); w.Mode != "forecast" || w.Prewarm != scale(6*time.Hour, 0.85) || w.KeepAlive != 2*scale(6*time.Hour, 0.15) {
		t.Fatalf("daily: %+v", w)
	}
	h.Forget("f")
	if w := h.Windows("f", fallback); w.Mode != "fallback" {
		t.Fatalf("forgotten: %+v", w)
	}
}

func scale(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }
