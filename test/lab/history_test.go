package lab

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

// The checker passes a history where every read sees the latest write and
// fails one with a stale read after an acknowledged write; a write of
// unknown outcome may be seen or not.
func TestHistoryCheck(t *testing.T) {
	op := func(c int, key string, write bool, v string, call, ret int64) porcupine.Operation {
		o := porcupine.Operation{ClientId: c, Input: RegisterOp{Key: key, Write: write, Value: v}, Call: call, Return: ret}
		if !write {
			o.Input, o.Output = RegisterOp{Key: key}, v
		}
		return o
	}
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"fresh reads", []porcupine.Operation{op(0, "a", true, "1", 0, 10), op(1, "a", false, "1", 11, 20), op(0, "b", false, "", 0, 5)}, true},
		{"stale read after an ack", []porcupine.Operation{op(0, "a", true, "1", 0, 10), op(0, "a", true, "2", 11, 20), op(1, "a", false, "1", 21, 30)}, false},
		{"unknown write seen", []porcupine.Operation{op(0, "a", true, "1", 0, math.MaxInt64), op(1, "a", false, "1", 30, 40)}, true},
		{"unknown write not seen", []porcupine.Operation{op(0, "a", true, "1", 0, math.MaxInt64), op(1, "a", false, "", 30, 40)}, true},
	} {
		h := &History{ops: c.ops}
		if ok, why := h.Check(0); ok != c.ok {
			t.Errorf("%s: linearizable %v (%s), want %v", c.name, ok, why, c.ok)
		}
	}
}
