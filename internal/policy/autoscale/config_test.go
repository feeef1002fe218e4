package autoscale

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigIsValidKnative(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	if c.TargetConcurrency != 0.7 || c.StableWindow != time.Minute || c.PanicWindow() != 6*time.Second {
		t.Fatalf("DefaultConfig() = %+v, want target 0.7, 60s stable, 6s panic window", c)
	}
}

func TestValidateNamesFieldValueAndRange(t *testing.T) {
	tests := []struct {
		label  string
		mutate func(*Config)
		want   string
	}{
		{"zero target", func(c *Config) { c.TargetConcurrency = 0 },
			"autoscale: target concurrency 0 out of range (0, +Inf)"},
		{"NaN target", func(c *Config) { c.TargetConcurrency = math.NaN() },
			"autoscale: target concurrency NaN out of range (0, +Inf)"},
		{"stable window too short", func(c *Config) { c.StableWindow = 500 * time.Millisecond },
			"autoscale: stable window 500ms out of range [1s, 1h]"},
		{"stable window too long", func(c *Config) { c.StableWindow = 2 * time.Hour },
			"autoscale: stable window 2h0m0s out of range [1s, 1h]"},
		{"stable window fractional", func(c *Config) { c.StableWindow = 1500 * time.Millisecond },
			"autoscale: stable window 1.5s is not a whole number of seconds"},
		{"panic window percent below 1", func(c *Config) { c.PanicWindowPercent = 0.5 },
			"autoscale: panic window percent 0.5 out of range [1, 100]"},
		{"panic window percent above 100", func(c *Config) { c.PanicWindowPercent = 101 },
			"autoscale: panic window percent 101 out of range [1, 100]"},
		{"panic threshold 1", func(c *Config) { c.PanicThreshold = 1 },
			"autoscale: panic threshold 1 out of range (1, +Inf)"},
		{"scale up rate 1", func(c *Config) { c.MaxScaleUpRate = 1 },
			"autoscale: max scale up rate 1 out of range (1, +Inf)"},
		{"scale down rate 0.5", func(c *Config) { c.MaxScaleDownRate = 0.5 },
			"autoscale: max scale down rate 0.5 out of range (1, +Inf)"},
		{"negative grace", func(c *Config) { c.ScaleToZeroGrace = -time.Second },
			"autoscale: scale to zero grace -1s out of range [0, +Inf)"},
		{"negative min scale", func(c *Config) { c.MinScale = -1 },
			"autoscale: min scale -1 out of range [0, +Inf)"},
		{"negative max scale", func(c *Config) { c.MaxScale = -1 },
			"autoscale: max scale -1 out of range [0, +Inf) (0 = unbounded)"},
		{"min above max", func(c *Config) { c.MinScale, c.MaxScale = 5, 3 },
			"autoscale: min scale 5 out of range [0, max scale 3]"},
		{"activation scale 0", func(c *Config) { c.ActivationScale = 0 },
			"autoscale: activation scale 0 out of range [1, +Inf)"},
		{"negative scale down delay", func(c *Config) { c.ScaleDownDelay = -2 * time.Second },
			"autoscale: scale down delay -2s out of range [0, 1h]"},
		{"fractional scale down delay", func(c *Config) { c.ScaleDownDelay = 1500 * time.Millisecond },
			"autoscale: scale down delay 1.5s is not a whole number of seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			c := DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Validate() = %v, want %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("errors.Is(%v, ErrInvalidConfig) = false", err)
			}
		})
	}
}

func TestValidateReportsEveryBadField(t *testing.T) {
	c := DefaultConfig()
	c.StableWindow, c.MaxScaleDownRate = 0, 1
	err := c.Validate()
	for _, field := range []string{"stable window", "max scale down rate"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate() = %v, want it to name %q", err, field)
		}
	}
}

func TestBriskAllowsWindowsBelowKnativeMinimum(t *testing.T) {
	c := DefaultConfig()
	c.StableWindow = time.Second
	if err := c.Validate(); err != nil {
		t.Fatalf("1s stable window: Validate() = %v, want nil", err)
	}
}

func TestTargetForResolvesLikeKnative(t *testing.T) {
	tests := []struct {
		label string
		cc    int
		util  float64
		want  float64
	}{
		{"CC=1 at 70%", 1, 0.7, 0.7},
		{"CC=10 at 70%", 10, 0.7, 7},
		{"CC=0 uses the soft default 100", 0, 0.7, 70},
		{"CC=1 at 100%", 1, 1, 1},
		{"utilization above 1 is a percentage", 1, 70, 0.7},
		{"never below TargetMin", 1, 0.001, TargetMin},
		{"zero utilization gives TargetMin", 4, 0, TargetMin},
		{"NaN utilization gives TargetMin", 4, math.NaN(), TargetMin},
	}
	for _, tt := range tests {
		if got := TargetFor(tt.cc, tt.util); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("%s: TargetFor(%d, %v) = %v, want %v", tt.label, tt.cc, tt.util, got, tt.want)
		}
	}
}
