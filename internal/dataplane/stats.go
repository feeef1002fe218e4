package dataplane

import "sync"

// loadStats integrates one function's load (requests queued or in flight)
// over time, for the autoscaler's time-weighted average concurrency. Times
// are monotonic nanoseconds from DataPlane.nanotime. The mutex is per
// function and held for a few instructions twice per request; an exact
// lock-free integral needs the load and the last-change time to move
// together, which one atomic word cannot hold.
type loadStats struct {
	mu       sync.Mutex
	load     int64 // queued + in flight now
	last     int64 // time of the last load change or interval cut
	integral int64 // load·ns since start
	start    int64 // start of the current interval
	requests int64 // arrivals in the current interval
	quiet    bool  // reported one zero-activity interval: silent until activity
}

func (s *loadStats) reset(now int64) {
	s.mu.Lock()
	s.last, s.start, s.quiet = now, now, true
	s.mu.Unlock()
}

func (s *loadStats) advanceLocked(now int64) {
	if now > s.last {
		s.integral += s.load * (now - s.last)
		s.last = now
	}
}

// arrive counts a call's arrival. woke: the function was quiet, so it
// must join the data plane's reporting list (DataPlane.noteActive).
func (s *loadStats) arrive(now int64) (woke bool) {
	s.mu.Lock()
	s.advanceLocked(now)
	s.load++
	s.requests++
	woke, s.quiet = s.quiet, false
	s.mu.Unlock()
	return woke
}

func (s *loadStats) depart(now int64) {
	s.mu.Lock()
	s.advanceLocked(now)
	s.load--
	s.mu.Unlock()
}

// isQuiet: nothing to report until the next arrival.
func (s *loadStats) isQuiet() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quiet
}

// inFlight is how many of fn's calls hold a sandbox slot now: its load
// less the calls waiting in its queue.
func (fn *function) inFlight() int32 {
	return int32(max(fn.stats.current()-int64(fn.q.Len()), 0))
}

// current returns the load now.
func (s *loadStats) current() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.load
}

// cut closes the interval at now and starts the next one. report is false
// when the interval had no activity and a zero interval was already reported
// (Dirigent stops sending idle functions; activity resumes reporting).
// maxSpan is the reporting interval: a quiet function is not cut while
// quiet (it is on no report's list), so its interval's start can be long
// past, and its average is over the last maxSpan, all of its load in it.
func (s *loadStats) cut(now, maxSpan int64) (avg float64, requests int64, report bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(now)
	span := now - s.start
	if maxSpan > 0 && span > maxSpan {
		span = maxSpan
	}
	if span > 0 {
		avg = float64(s.integral) / float64(span)
	}
	requests = s.requests
	active := requests > 0 || s.integral > 0 || s.load > 0
	s.integral, s.requests, s.start = 0, 0, now
	switch {
	case active:
		s.quiet = false
		return avg, requests, true
	case s.quiet:
		return 0, 0, false
	default:
		s.quiet = true
		return 0, 0, true
	}
}
