package async

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkYieldBusy: what the gate costs while a data plane accepts
// submits and attempts queue behind the floor. Per op one submit; 256
// attempts wait, each runs 1 ms (asleep) once let in. "cores" is the
// process's CPU over the run's wall time: what the gate and its waiters
// burn, which the submits then lack.
func BenchmarkYieldBusy(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	y := newYielder(1)
	y.burst = time.Hour
	done := y.accepting() // busy for the whole run
	defer done()
	const waiters = 256
	var wg sync.WaitGroup
	wg.Add(waiters)
	for range waiters {
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && y.enter(ctx) {
				time.Sleep(time.Millisecond)
				y.leave()
			}
		}()
	}
	cpu0, t0 := processCPU(), time.Now()
	b.ResetTimer()
	for range b.N {
		y.accepting()()
		time.Sleep(100 * time.Microsecond) // submits are spread out
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Since(t0)), "cores")
	cancel()
	wg.Wait()
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
