package spec

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseMilliCPU reads a Kubernetes CPU quantity ("250m", "0.5", "2") as
// millicores; "" is 0.
func ParseMilliCPU(q string) (int64, error) {
	if q == "" {
		return 0, nil
	}
	if v, ok := strings.CutSuffix(q, "m"); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a CPU quantity", q)
		}
		return n, nil
	}
	x, err := strconv.ParseFloat(q, 64)
	if err != nil || x < 0 || x > 1e6 {
		return 0, fmt.Errorf("%q is not a CPU quantity", q)
	}
	return int64(math.Round(x * 1000)), nil
}

// ParseMemoryMB reads a Kubernetes memory quantity ("128Mi", "1Gi",
// "500M", bytes) as MiB, rounded up; "" is 0.
func ParseMemoryMB(q string) (int64, error) {
	if q == "" {
		return 0, nil
	}
	mult, num := 1.0, q
	for _, u := range []struct {
		suffix string
		bytes  float64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}} {
		if v, ok := strings.CutSuffix(q, u.suffix); ok {
			mult, num = u.bytes, v
			break
		}
	}
	x, err := strconv.ParseFloat(num, 64)
	if err != nil || x < 0 || x*mult > 1<<50 {
		return 0, fmt.Errorf("%q is not a memory quantity", q)
	}
	return int64(math.Ceil(x * mult / (1 << 20))), nil
}
