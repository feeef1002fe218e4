// Package statefile keeps a small file that a worker rewrites on every
// change, such as a runtime's sandbox table, without creating a file per
// write. It writes in place to one of two slots in turn, each headed by a
// sequence number and a checksum, and reads back the newest slot that is
// whole. A write cut short (the worker killed between truncate and write)
// spoils only the slot being written; the other still holds the change
// before. Creating and renaming a temporary file per change, the usual way,
// costs a fresh inode each time, which on ext4 with many recent deletions
// took longer than the sandbox start being recorded.
//
// It does not fsync: the state it keeps has to survive the worker process,
// and the sandboxes it lists do not survive a machine crash anyway.
package statefile

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// magic starts every slot's header line: "brisk-state SEQ CRC\n".
const magic = "brisk-state"

// File is one state file: NAME.0 and NAME.1 in a directory. It is safe for
// concurrent use.
type File struct {
	path string // dir/NAME; the slots are path.0 and path.1
	mu   sync.Mutex
	seq  uint64 // of the newest slot written or read
	slot int    // which slot holds seq
}

// Open reads the newest whole slot of dir/name and returns it with the
// File to write the next ones through. No slot at all is an empty state
// (nil data). A plain dir/name, as an earlier version wrote it, is read
// when no slot is whole, and removed by the first Write. It is an error
// when both slots exist and neither is whole.
func Open(dir, name string) (*File, []byte, error) {
	f := &File{path: filepath.Join(dir, name), slot: 1}
	var newest []byte
	found, whole := 0, false
	var errs []error
	for i := range 2 {
		b, err := os.ReadFile(f.slotPath(i))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		found++
		if err != nil {
			errs = append(errs, err)
			continue
		}
		seq, data, err := parse(b)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.slotPath(i), err))
			continue
		}
		if !whole || seq > f.seq {
			f.seq, f.slot, newest, whole = seq, i, data, true
		}
	}
	switch {
	case whole:
		return f, newest, nil
	case found == 2:
		return nil, nil, errors.Join(errs...)
	}
	// No slot, or only the first one ever written, cut short: the state
	// is what it was before any write.
	b, err := os.ReadFile(f.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	return f, b, nil
}

// Path is dir/name, the prefix of both slots (for messages).
func (f *File) Path() string { return f.path }

func (f *File) slotPath(i int) string { return f.path + "." + strconv.Itoa(i) }

// Write makes data the file's newest state: it overwrites the older slot.
func (f *File) Write(data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	seq, slot := f.seq+1, 1-f.slot
	buf := make([]byte, 0, len(data)+48)
	buf = append(buf, magic...)
	buf = append(buf, ' ')
	buf = strconv.AppendUint(buf, seq, 10)
	buf = append(buf, ' ')
	buf = strconv.AppendUint(buf, uint64(crc32.ChecksumIEEE(data)), 10)
	buf = append(buf, '\n')
	buf = append(buf, data...)
	if err := os.WriteFile(f.slotPath(slot), buf, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", f.slotPath(slot), err)
	}
	if f.seq == 0 {
		_ = os.Remove(f.path) // an earlier version's plain file, now stale
	}
	f.seq, f.slot = seq, slot
	return nil
}

func parse(b []byte) (seq uint64, data []byte, err error) {
	head, data, ok := bytes.Cut(b, []byte{'\n'})
	fields := bytes.Fields(head)
	if !ok || len(fields) != 3 || string(fields[0]) != magic {
		return 0, nil, errors.New("not a whole state file (no header)")
	}
	seq, err1 := strconv.ParseUint(string(fields[1]), 10, 64)
	sum, err2 := strconv.ParseUint(string(fields[2]), 10, 32)
	if err1 != nil || err2 != nil {
		return 0, nil, errors.New("not a whole state file (bad header)")
	}
	if crc32.ChecksumIEEE(data) != uint32(sum) {
		return 0, nil, errors.New("not a whole state file (checksum mismatch: cut short)")
	}
	return seq, data, nil
}
