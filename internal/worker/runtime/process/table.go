package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
}

type tableJSON struct {
	Version   int      `json:"version"`
	Sandboxes []record `json:"sandboxes"`
}

// readTable loads StateDir/sandboxes.json; a missing file is an empty table.
func readTable(dir string) ([]record, error) {
	path := filepath.Join(dir, tableFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var t tableJSON
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if t.Version != tableVersion {
		return nil, fmt.Errorf("%s: version %d, this worker reads version %d", path, t.Version, tableVersion)
	}
	return t.Sandboxes, nil
}

// writeTable replaces StateDir/sandboxes.json atomically (temp file, then
// rename), so a reader sees the old or the new table, never half of one. It
// does not fsync: the table only has to survive the worker process, and the
// sandboxes it lists do not survive a machine crash anyway.
func writeTable(dir string, recs []record) error {
	b, err := json.MarshalIndent(tableJSON{Version: tableVersion, Sandboxes: recs}, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tableFile+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, tableFile))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write sandbox table: %w", err)
	}
	return nil
}
