package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/brisk-faas/brisk/internal/sim"
	"github.com/brisk-faas/brisk/internal/workload"
)

// Calibration is what the simulator takes from a real run of the same
// schedule (brisk replay's invocations.csv): the system's own costs, so
// that what is left to compare is what the simulator decides (which calls
// are cold, how many sandboxes live when).
type Calibration struct {
	// Overhead: each call's response beyond its runtime and its wait for a
	// sandbox, over time.
	Overhead *sim.OverheadProfile
	// ColdWait is the median wait for a new sandbox of the measured
	// phase's cold calls: the creation time as the data plane sees it
	// (the runtime's, then the control plane's path to its endpoint).
	ColdWait time.Duration
	// Calls and ColdCalls are how many records it was made of.
	Calls, ColdCalls int
}

// CalibrationWindow is the width of an overhead profile's windows.
const CalibrationWindow = 100 * time.Millisecond

// maxCalibrationWindows bounds an overhead profile's windows (and its
// memory); maxRecordUs a record's times (a day).
const (
	maxCalibrationWindows = 100_000
	maxRecordUs           = int64(24 * time.Hour / time.Microsecond)
)

// calibrationSkew is how far a record's scheduled send may be from where
// the schedule puts it (they agree to microseconds).
const calibrationSkew = 10 * time.Millisecond

// CalibrateFromFile reads a replay's invocations.csv (dir/invocations.csv
// when path is a directory) and calibrates cfg's schedule from it.
func CalibrateFromFile(cfg ReplayConfig, path string) (*Calibration, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "invocations.csv")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := workload.ReadRecords(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return Calibrate(cfg, recs)
}

// Calibrate builds a Calibration from the records of a real run of cfg's
// schedule. A record is placed by its invocation's scheduled offset (time
// scale applied), so its own lateness does not move it; records of another
// schedule (an invocation it lacks, or sent at other offsets) are refused.
func Calibrate(cfg ReplayConfig, recs []workload.Record) (*Calibration, error) {
	s, err := cfg.Schedule()
	if err != nil {
		return nil, err
	}
	type key struct{ fn, id string }
	offsets := make(map[key]time.Duration, len(s.Invocations))
	var end time.Duration
	for i := range s.Invocations {
		inv := &s.Invocations[i]
		off := inv.Offset
		if cfg.TimeScale != 1 {
			off = workload.ScaleOffset(off, cfg.TimeScale)
		}
		offsets[key{workload.FunctionName(s.Functions[inv.Func].Row), s.InvocationID(inv)}] = off
		end = max(end, off)
	}
	// At most maxCalibrationWindows windows: a long schedule gets wider ones.
	width := max(CalibrationWindow, end/maxCalibrationWindows+1)
	c := &Calibration{Overhead: &sim.OverheadProfile{Window: width, Windows: make([][]time.Duration, int(end/width)+1)}}
	var waits []time.Duration
	// Each record's scheduled send (its send less its lateness) less its
	// offset is the run's start: the same for all when the schedule is
	// the one the run followed.
	var start0 int64
	seen := make(map[key]bool, len(recs))
	for i := range recs {
		r := &recs[i]
		k := key{r.Function, r.InvocationID}
		off, ok := offsets[k]
		if !ok {
			return nil, fmt.Errorf("record %d (%s %s) is not in this schedule: calibrate from a replay of the same trace window, seed, arrivals and time scale", i, r.Function, r.InvocationID)
		}
		if seen[k] {
			return nil, fmt.Errorf("record %d (%s %s): the invocation is in the file twice", i, r.Function, r.InvocationID)
		}
		seen[k] = true
		// Times in µs, compared before any conversion (which could wrap).
		for _, v := range []int64{r.ResponseUs, r.RequestedUs, r.QueueUs, r.LatenessUs} {
			if v < 0 || v > maxRecordUs {
				return nil, fmt.Errorf("record %d (%s %s): a time of %d µs is outside 0..%d", i, r.Function, r.InvocationID, v, int64(maxRecordUs))
			}
		}
		if st := r.StartTime - r.LatenessUs - off.Microseconds(); i == 0 {
			start0 = st
		} else if d := st - start0; d > calibrationSkew.Microseconds() || d < -calibrationSkew.Microseconds() {
			return nil, fmt.Errorf("record %d (%s %s) was sent %d µs off this schedule: calibrate from a replay of the same trace window, seed, arrivals and time scale", i, r.Function, r.InvocationID, d)
		}
		if !r.OK() {
			continue
		}
		w := &c.Overhead.Windows[off/width]
		*w = append(*w, time.Duration(max(r.ResponseUs-r.RequestedUs-r.QueueUs, 0))*time.Microsecond)
		c.Calls++
		if r.Cold && r.Phase == 2 {
			waits = append(waits, time.Duration(r.QueueUs)*time.Microsecond)
		}
	}
	if c.Calls == 0 || 2*c.Calls < len(recs) {
		return nil, fmt.Errorf("%d of %d calls completed: a run that failed this much says little about the system's costs", c.Calls, len(recs))
	}
	if c.ColdCalls = len(waits); len(waits) > 0 {
		slices.Sort(waits)
		c.ColdWait = waits[len(waits)/2]
	}
	return c, nil
}

// String says what the calibration measured.
func (c *Calibration) String() string {
	var all []time.Duration
	for _, w := range c.Overhead.Windows {
		all = append(all, w...)
	}
	slices.Sort(all)
	return "calibrated from " + strconv.Itoa(c.Calls) + " calls: overhead median " + all[len(all)/2].String() +
		", p99 " + all[len(all)*99/100].String() + "; measured cold calls' median wait " + c.ColdWait.String() +
		" (of " + strconv.Itoa(c.ColdCalls) + ")"
}
