package autoscale

import (
	"errors"
	"testing"
	"time"
)

func TestSyncCreatesOnlyWithoutIdleInstances(t *testing.T) {
	s := DefaultSync()
	for _, tt := range []struct {
		idle int
		want bool
	}{{0, true}, {-1, true}, {1, false}, {7, false}} {
		if got := s.OnRequest(t0, tt.idle); got != tt.want {
			t.Errorf("OnRequest(idle=%d) = %v, want %v", tt.idle, got, tt.want)
		}
	}
}

func TestSyncExpiresAfterKeepAlive(t *testing.T) {
	s := DefaultSync()
	if s.KeepAlive != 10*time.Minute {
		t.Fatalf("DefaultSync().KeepAlive = %v, want 10m", s.KeepAlive)
	}
	tests := []struct {
		idleFor time.Duration
		want    bool
	}{{0, false}, {10*time.Minute - time.Nanosecond, false}, {10 * time.Minute, true}, {time.Hour, true}}
	for _, tt := range tests {
		if got := s.Expired(t0.Add(tt.idleFor), t0); got != tt.want {
			t.Errorf("Expired after %v idle = %v, want %v", tt.idleFor, got, tt.want)
		}
	}
	if got := s.ExpiresAt(t0); !got.Equal(t0.Add(10 * time.Minute)) {
		t.Errorf("ExpiresAt = %v, want t0+10m", got)
	}
	if !(Sync{}).Expired(t0, t0) {
		t.Error("zero KeepAlive: Expired at the moment of idling = false, want true")
	}
}

func TestSyncPicksMostRecentlyUsedIdleInstance(t *testing.T) {
	s := DefaultSync()
	tests := []struct {
		lastUsed []time.Time
		want     int
	}{
		{nil, -1},
		{[]time.Time{at(5)}, 0},
		{[]time.Time{at(1), at(9), at(4)}, 1},
		{[]time.Time{at(9), at(2), at(9)}, 0}, // tie goes to the lowest index
	}
	for _, tt := range tests {
		if got := s.PickIdle(tt.lastUsed); got != tt.want {
			t.Errorf("PickIdle(%v) = %d, want %d", tt.lastUsed, got, tt.want)
		}
	}
}

func TestSyncValidate(t *testing.T) {
	if err := DefaultSync().Validate(); err != nil {
		t.Fatalf("DefaultSync().Validate() = %v", err)
	}
	err := Sync{KeepAlive: -time.Second}.Validate()
	if want := "autoscale: keep alive -1s out of range [0, +Inf)"; err == nil || err.Error() != want || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate() = %v, want %q matching ErrInvalidConfig", err, want)
	}
}

// Sync mode: a burst's peak is held for the keep-alive, then the function
// goes to zero; a later, smaller burst does not lower the held peak.
func TestSyncConfigHoldsThePeakForTheKeepAlive(t *testing.T) {
	cfg := SyncConfig(DefaultConfig(), 30*time.Second)
	cfg.TargetConcurrency = 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	k := NewKPA(cfg, t0)
	k.Record(t0, 5)
	if d := k.Decide(t0.Add(time.Second), 0); d.Desired != 5 || d.Panic {
		t.Fatalf("after a burst of 5: %+v, want 5 at once, no panic", d)
	}
	now := t0.Add(time.Second)
	for range 20 { // idle for 20 s, then one call
		now = now.Add(time.Second)
		k.Record(now, 0)
	}
	k.Record(now, 1)
	if d := k.Decide(now, 5); d.Desired != 5 {
		t.Errorf("20 s after the burst: %d, want the peak 5 kept for the 30 s keep-alive", d.Desired)
	}
	for range 31 {
		now = now.Add(time.Second)
		k.Record(now, 0)
	}
	if d := k.Decide(now, 5); d.Desired != 0 {
		t.Errorf("31 s after the last call: %d, want 0", d.Desired)
	}
}
