package store

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// BenchmarkCreateFunction measures durable registrations with 16 concurrent
// writers sharing group commits.
func BenchmarkCreateFunction(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var n atomic.Int64
	b.SetParallelism(8) // 16 writers on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			f := &spec.Function{Name: fmt.Sprintf("f-%d", n.Add(1)), Builtin: "trace"}
			f.ApplyDefaults()
			if _, err := s.CreateFunction(f); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
