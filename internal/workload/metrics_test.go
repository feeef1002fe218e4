package workload

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPercentileInterpolatesLikeNumpy(t *testing.T) {
	v := []float64{1, 2, 3, 4}
	for _, tc := range []struct{ p, want float64 }{{0, 1}, {25, 1.75}, {50, 2.5}, {90, 3.7}, {99, 3.97}, {100, 4}} {
		if got := Percentile(v, tc.p); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("p%g of %v = %g, want %g", tc.p, v, got, tc.want)
		}
	}
	if got := Percentile([]float64{7}, 99); got != 7 {
		t.Errorf("p99 of one value = %g", got)
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("percentile of nothing is not NaN")
	}
}

// handMade is a per-invocation CSV small enough to check by hand (see
// TestMetricsOnHandMadeCSV for the expected values).
const handMade = `phase,instance,invocationID,startTime,requestedDuration,grpcConnEstablish,responseTime,actualDuration,connectionTimeout,functionTimeout,actualMemoryUsage,memoryAllocationTimeout,function,status,cold,queue_us,sandbox,lateness_us,error
1,fa,min0.inv0,1000000,100000,0,900000,100000,false,false,10,false,fa,200,true,0,s1,0,
2,fa,min0.inv0,1000000,100000,0,300000,100000,false,false,10,false,fa,200,true,0,s1,0,
2,fa,min10.inv0,2000000,100000,0,200000,100000,false,false,10,false,fa,200,false,0,s1,0,
2,fa,min11.inv0,3000000,100000,0,800000,150000,false,false,10,false,fa,200,false,0,s1,0,
2,fa,min12.inv0,4000000,100000,0,90000,90000,false,false,10,false,fa,200,false,0,s1,0,
2,fb,min10.inv0,2000000,1000000,0,1000000,990000,false,false,10,false,fb,200,true,0,s2,0,
2,fb,min10.inv1,2500000,10000,0,40000,10000,false,false,10,false,fb,200,false,0,s2,0,
2,fb,min11.inv0,3000000,10000,0,5000,0,false,true,0,false,fb,503,false,0,,0,queue full
2,fc,min3.inv0,5000000,50000,0,500000,50000,false,false,10,false,fc,200,true,0,s3,0,
`

func TestMetricsOnHandMadeCSV(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(handMade))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 9 {
		t.Fatalf("read %d records", len(recs))
	}

	s := Summarize(recs)
	if s.Issued != 8 || s.Completed != 7 || s.Failed != 1 || s.WarmupIssued != 1 || s.ColdStarts != 3 || s.FuncTimeouts != 1 {
		t.Fatalf("summary counts %+v", s)
	}
	// Completed calls span 1.0 s (first send) to 5.5 s (fc's reply).
	if want := 7 / 4.5; math.Abs(s.ThroughputRPS-want) > 1e-9 {
		t.Errorf("throughput %g, want %g", s.ThroughputRPS, want)
	}
	lat := []float64{300, 200, 800, 90, 1000, 40, 500}
	slices.Sort(lat)
	if s.LatencyMs.P50 != 300 || s.LatencyMs.Max != 1000 || math.Abs(s.LatencyMs.P99-Percentile(lat, 99)) > 1e-9 {
		t.Errorf("latency %+v", s.LatencyMs)
	}

	sd, pf := Slowdowns(recs, SlowdownOptions{SkipMinutes: DefaultSkipMinutes})
	// Headline: every completed phase-2 call.
	//   fa: 3, 2, 8, 0.9 → sorted 0.9 2 3 8 → p99 = 3 + 0.97·5 = 7.85
	//   fb: 1, 4 → p99 = 1 + 0.99·3 = 3.97
	//   fc: 10
	wantHeadline := math.Cbrt(7.85 * 3.97 * 10)
	if math.Abs(sd.GeomeanP99-wantHeadline) > 1e-9 || sd.Functions != 3 {
		t.Errorf("geomean p99 %g over %d functions, want %g over 3", sd.GeomeanP99, sd.Functions, wantHeadline)
	}
	// Papers' filters: minutes ≥ 10 and slowdown ≥ 1.
	//   fa: 2, 8 (0.9 dropped) → gmean 4, mean 5;  fb: 1, 4 → gmean 2, mean 2.5;  fc: none.
	if sd.DirigentGmeanMedian == nil || math.Abs(*sd.DirigentGmeanMedian-3) > 1e-9 {
		t.Errorf("Dirigent median of per-function gmeans %v, want 3", sd.DirigentGmeanMedian)
	}
	if sd.KubeDirectMeanMedian == nil || math.Abs(*sd.KubeDirectMeanMedian-3.75) > 1e-9 {
		t.Errorf("KubeDirect median of per-function means %v, want 3.75", sd.KubeDirectMeanMedian)
	}
	if sd.FilteredFunctions != 2 || sd.FilteredCalls != 4 || sd.DroppedBelowOne != 1 {
		t.Errorf("filters kept %d functions, %d calls, dropped %d below one", sd.FilteredFunctions, sd.FilteredCalls, sd.DroppedBelowOne)
	}
	if len(pf.P99) != 3 || len(pf.DirigentGmean) != 2 {
		t.Errorf("per-function values %+v", pf)
	}

	// With a warm-up of 3 columns, minute 10 of the ids is minute 7 of the
	// measured phase, so only fa's min13+ would pass: none.
	sd2, _ := Slowdowns(recs, SlowdownOptions{WarmupColumns: 3, SkipMinutes: DefaultSkipMinutes})
	if sd2.DirigentGmeanMedian != nil || sd2.FilteredCalls != 0 {
		t.Errorf("warm-up shifted filter kept %d calls", sd2.FilteredCalls)
	}

	// Scheduling latency = response − actual, completed phase-2 calls.
	sched, perFn := SchedulingLatency(recs)
	want := []float64{200, 100, 650, 0, 10, 30, 450}
	slices.Sort(sched)
	slices.Sort(want)
	if !slices.Equal(sched, want) {
		t.Errorf("scheduling latencies %v, want %v", sched, want)
	}
	if math.Abs(Percentile(sched, 50)-100) > 1e-9 {
		t.Errorf("scheduling latency p50 %g, want 100", Percentile(sched, 50))
	}
	if !slices.Equal(perFn, []float64{237.5, 20, 450}) {
		t.Errorf("per-function mean scheduling latency %v", perFn)
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(handMade))
	if err != nil {
		t.Fatal(err)
	}
	recs[0].Error = `comma, and "quote"`
	var buf bytes.Buffer
	if err := WriteRecords(&buf, recs); err != nil {
		t.Fatal(err)
	}
	back, err := ReadRecords(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(recs, back) {
		t.Fatalf("round trip changed records:\n%+v\n%+v", recs, back)
	}
	if recs[2].Minute() != 10 || (&Record{InvocationID: "sec7.inv1"}).Minute() != 7 || (&Record{InvocationID: "x"}).Minute() != -1 {
		t.Fatal("Minute parses ids wrongly")
	}
}

func TestReadRecordsOfTheLoader(t *testing.T) {
	// The loader's own columns only: success is the absence of timeouts and
	// the instance names the function.
	const loader = "phase,instance,invocationID,startTime,requestedDuration,grpcConnEstablish,responseTime,actualDuration,connectionTimeout,functionTimeout,actualMemoryUsage,memoryAllocationTimeout\n" +
		"2,trace-func-0-123,min10.inv0,1,100000,5,300000,100000,false,false,0,false\n" +
		"2,trace-func-0-123,min10.inv1,2,100000,5,0,0,false,true,0,false\n"
	recs, err := ReadRecords(strings.NewReader(loader))
	if err != nil {
		t.Fatal(err)
	}
	if !recs[0].OK() || recs[1].OK() || recs[0].Function != "trace-func-0-123" {
		t.Fatalf("loader rows read as %+v", recs)
	}
	if _, err := ReadRecords(strings.NewReader("phase,instance\n2,x\n")); err == nil || !strings.Contains(err.Error(), "no invocationID column") {
		t.Fatalf("missing columns: %v", err)
	}
	bad := strings.Replace(loader, ",300000,", ",3e5x,", 1)
	if _, err := ReadRecords(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 2 column responseTime") {
		t.Fatalf("bad number: %v", err)
	}
}

func TestMemoryCost(t *testing.T) {
	c := ComputeMemoryCost([]MemorySample{
		{At: 0, ReservedMB: 1024, BusyMB: 0},
		{At: 1, ReservedMB: 2048, BusyMB: 1024},
		{At: 2, ReservedMB: 2048, BusyMB: 4096}, // busy is capped at reserved
		{At: 3, ReservedMB: 9999, BusyMB: 0},    // the last sample closes the interval
	})
	if c.GBs != 5 || math.Abs(c.IdleShare-0.4) > 1e-12 || c.Samples != 4 {
		t.Fatalf("memory cost %+v, want 5 GiB·s with idle share 1-3072/5120 = 0.4", c)
	}
	if c := ComputeMemoryCost(nil); c.GBs != 0 || c.IdleShare != 0 {
		t.Fatalf("no samples: %+v", c)
	}
}
