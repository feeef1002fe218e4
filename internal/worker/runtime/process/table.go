package process

import (
	"encoding/json"
	"fmt"

	"github.com/brisk-faas/brisk/internal/worker/runtime/statefile"
)

const (
	tableFile    = "sandboxes.json"
	tableVersion = 1
)

// record is what the sandbox table keeps about one sandbox: enough for a
// restarted worker to find the process again, prove it is the same process
// despite pid reuse, and stop it.
type record struct {
	ID       string `json:"id"`
	Function string `json:"function"`
	Revision uint64 `json:"revision"`
	PID      int    `json:"pid"`
	PGID     int    `json:"pgid"`
	// StartTime is field 22 of /proc/<pid>/stat: clock ticks after boot.
	StartTime uint64 `json:"start_time"`
	Addr      string `json:"addr"`
	// Cgroup is the cgroup path relative to each hierarchy root, "" when
	// the sandbox has none.
	Cgroup string `json:"cgroup,omitempty"`
	// Secrets says the sandbox's secrets are in StateDir/secrets/<id>/
	// (a worker without root; see secrets.go).
	Secrets bool `json:"secrets,omitempty"`
	// UID is the function's own user the sandbox runs as (users.go), 0
	// when it runs as the runtime's: with the port, its loopback guard
	// entry (guard.go).
	UID uint32 `json:"uid,omitempty"`
}

type tableJSON struct {
	Version   int      `json:"version"`
	Sandboxes []record `json:"sandboxes"`
}

// readTable loads StateDir/sandboxes.json (statefile's two slots); none is
// an empty table.
func readTable(dir string) (*statefile.File, []record, error) {
	f, b, err := statefile.Open(dir, tableFile)
	if err != nil || len(b) == 0 {
		return f, nil, err
	}
	var t tableJSON
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", f.Path(), err)
	}
	if t.Version != tableVersion {
		return nil, nil, fmt.Errorf("%s: version %d, this worker reads version %d", f.Path(), t.Version, tableVersion)
	}
	return f, t.Sandboxes, nil
}

// writeTable makes recs the table's newest state (statefile: written in
// place, a reader sees the old or the new table, never half of one).
func writeTable(f *statefile.File, recs []record) error {
	b, err := json.MarshalIndent(tableJSON{Version: tableVersion, Sandboxes: recs}, "", "  ")
	if err != nil {
		return err
	}
	if err := f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write sandbox table: %w", err)
	}
	return nil
}
