package spec

import (
	"encoding/json"
	"testing"
)

// Decode is on the admin API's write path: every registration and update
// decodes one spec (bench register: 10,000 of them).
func BenchmarkDecode(b *testing.B) {
	for _, tc := range []struct {
		name string
		f    *Function
	}{
		{"bench-register", &Function{Name: "reg-1234-5678", Builtin: "trace", Concurrency: 1}},
		{"full", &Function{Name: "api", Command: []string{"python3", "-m", "app"}, Env: map[string]string{"A": "1", "B": "2", "LOG": "debug"},
			Labels: map[string]string{"team": "a"}, Scaling: Scaling{Min: 1, Max: 10}, Resources: Resources{MilliCPU: 250, MemoryMB: 128},
			Queue: Queue{Depth: 50}, Timeout: Duration(30e9)}},
	} {
		data, err := json.Marshal(tc.f)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := Decode(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
