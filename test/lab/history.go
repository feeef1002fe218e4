package lab

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// History records the operations clients ran on registers (a key's latest
// value) during a fault schedule, for a linearizability check with
// porcupine afterwards: each key is a register, a write sets it, a read
// returns it.
type History struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
	// Acked counts the acknowledged writes; Unknown the writes whose
	// outcome is not known (an error or a timeout: they may have happened);
	// Refused the writes known not to have happened (Refuse).
	Acked, Unknown, Refused, Reads, FailedReads int
}

// RegisterOp is an operation's input.
type RegisterOp struct {
	Key   string
	Write bool
	Value string // written
}

// NewHistory starts a history now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time since the history started, for an operation's call.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Write records a write of value to key called at call. ok: acknowledged;
// otherwise it may or may not have happened, and stays open to the end.
func (h *History) Write(client int, key, value string, call int64, ok bool) {
	ret := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if ok {
		h.Acked++
	} else {
		h.Unknown++
		ret = math.MaxInt64
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: RegisterOp{Key: key, Write: true, Value: value}, Call: call, Return: ret})
}

// Refuse counts a write that certainly did not happen (refused before it
// was applied): it is left out of the history, as a failed read is.
func (h *History) Refuse() {
	h.mu.Lock()
	h.Refused++
	h.mu.Unlock()
}

// Read records a read of key called at call that returned value (ok) or
// failed (a failed read is left out: it observed nothing).
func (h *History) Read(client int, key string, call int64, value string, ok bool) {
	ret := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !ok {
		h.FailedReads++
		return
	}
	h.Reads++
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: RegisterOp{Key: key}, Output: value, Call: call, Return: ret})
}

// registerModel: a map of registers, partitioned by key; a key never
// written reads "".
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(RegisterOp).Key
			by[k] = append(by[k], op)
		}
		keys := make([]string, 0, len(by))
		for k := range by {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(RegisterOp)
		if in.Write {
			return true, in.Value
		}
		return output.(string) == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(RegisterOp)
		if in.Write {
			return fmt.Sprintf("write(%s, %s)", in.Key, in.Value)
		}
		return fmt.Sprintf("read(%s) -> %v", in.Key, output)
	},
}

// Check runs porcupine over the history: ok when it is linearizable (or
// the check ran out of time: "unknown" in the reason); otherwise why names
// the registers whose histories are not.
func (h *History) Check(timeout time.Duration) (ok bool, why string) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	switch porcupine.CheckOperationsTimeout(registerModel, ops, timeout) {
	case porcupine.Ok:
		return true, ""
	case porcupine.Unknown:
		return true, "unknown: the check timed out"
	}
	var bad []string
	for _, part := range registerModel.Partition(ops) {
		if !porcupine.CheckOperations(registerModel, part) {
			bad = append(bad, part[0].Input.(RegisterOp).Key)
		}
	}
	return false, "not linearizable: registers " + strings.Join(bad, ", ")
}

// Dump writes the history as JSON lines (client, key, write, value, call
// and return in ns since the start; return -1: open), for a failed check.
func (h *History) Dump(path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b []byte
	for _, op := range h.ops {
		in := op.Input.(RegisterOp)
		ret := op.Return
		if ret == math.MaxInt64 {
			ret = -1
		}
		v := in.Value
		if !in.Write {
			v = op.Output.(string)
		}
		b = fmt.Appendf(b, "{\"client\":%d,\"key\":%q,\"write\":%v,\"value\":%q,\"call\":%d,\"return\":%d}\n", op.ClientId, in.Key, in.Write, v, op.Call, ret)
	}
	return os.WriteFile(path, b, 0o644)
}
