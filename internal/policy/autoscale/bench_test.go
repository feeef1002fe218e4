package autoscale

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkKPARecord measures one observation into both windows, one second apart.
func BenchmarkKPARecord(b *testing.B) {
	for _, window := range []time.Duration{time.Minute, time.Hour} {
		b.Run(fmt.Sprintf("window=%v", window), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.StableWindow = window
			k := NewKPA(cfg, t0)
			b.ReportAllocs()
			sec := 0
			for b.Loop() {
				sec++
				k.Record(at(sec), float64(sec%13))
			}
		})
	}
}

// BenchmarkKPADecide measures one decision over a full window, with and without the
// scale-down delay window.
func BenchmarkKPADecide(b *testing.B) {
	for _, tc := range []struct {
		window, delay time.Duration
	}{{time.Minute, 0}, {time.Minute, 30 * time.Second}, {time.Hour, 0}} {
		b.Run(fmt.Sprintf("window=%v/delay=%v", tc.window, tc.delay), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.StableWindow, cfg.ScaleDownDelay = tc.window, tc.delay
			k := NewKPA(cfg, t0)
			n := int(tc.window / time.Second)
			for sec := range n {
				k.Record(at(sec), float64(sec%13))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				k.Decide(at(n-1+i%2), 5+i%7)
			}
		})
	}
}
