package process

import (
	"encoding/json"
	"fmt"
	"sync"
	"syscall"

	"github.com/brisk-faas/brisk/internal/worker/runtime/statefile"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Per-function users. As root with no Config.User, each function's
// sandboxes (and its template) run as a user of their own, taken from a
// range no distribution hands out (FunctionUIDBase on): another
// function's sandbox, a different user, cannot read their environment or
// memory, enter their mount namespace through /proc/<pid>/root, signal or
// ptrace them, or read files they made private. The user is recorded in
// <StateDir>/users.json by the function's identity (spec.Function.UID,
// which a deleted and recreated name does not share), so a restarted
// worker runs a function's new sandboxes as the user its adopted ones
// have, and a uid is never given to another function: a later function
// cannot come by files an earlier one left.

const (
	// FunctionUIDBase is the first per-function uid (and gid); the range
	// holds maxFunctionUsers of them. It is aligned to the range's size,
	// so that the loopback guard matches it with one mask (guard.go).
	FunctionUIDBase  = 0x77400000 // 2,000,683,008
	maxFunctionUsers = 1 << 20
	usersFile        = "users.json"
)

// users allocates and remembers per-function uids.
type users struct {
	mu   sync.Mutex
	file *statefile.File
	next uint32            // offsets below it are taken
	byFn map[string]uint32 // function key → offset
}

type usersRecord struct {
	Next      uint32            `json:"next"`
	Functions map[string]uint32 `json:"functions"`
}

func openUsers(dir string) (*users, error) {
	f, b, err := statefile.Open(dir, usersFile)
	if err != nil {
		return nil, err
	}
	u := &users{file: f, byFn: map[string]uint32{}}
	if len(b) > 0 {
		var rec usersRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path(), err)
		}
		u.next = rec.Next
		for k, off := range rec.Functions {
			if off >= maxFunctionUsers {
				return nil, fmt.Errorf("%s: function %s has uid offset %d, beyond the range", f.Path(), k, off)
			}
			u.byFn[k] = off
			u.next = max(u.next, off+1)
		}
	}
	return u, nil
}

// functionKey is what a function's user belongs to: its identity when it
// has one (every function the control plane made), else its namespace and
// name.
func functionKey(f *spec.Function) string {
	if f.UID != "" {
		return "uid:" + f.UID
	}
	return "name:" + spec.NamespaceOf(f) + "/" + f.Name
}

// identityOf is the user f's sandboxes run as, allocated and recorded on
// first use.
func (u *users) identityOf(f *spec.Function) (identity, error) {
	k := functionKey(f)
	u.mu.Lock()
	defer u.mu.Unlock()
	off, ok := u.byFn[k]
	if !ok {
		if u.next >= maxFunctionUsers {
			return identity{}, fmt.Errorf("every one of the %d per-function users is taken", maxFunctionUsers)
		}
		off = u.next
		u.byFn[k] = off
		u.next++
		b, err := json.Marshal(usersRecord{Next: u.next, Functions: u.byFn})
		if err == nil {
			err = u.file.Write(b)
		}
		if err != nil {
			delete(u.byFn, k)
			u.next--
			return identity{}, fmt.Errorf("recording function %s's user: %w", f.Name, err)
		}
	}
	id := uint32(FunctionUIDBase) + off
	return identity{uid: id, gid: id, cred: &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}}, nil
}
