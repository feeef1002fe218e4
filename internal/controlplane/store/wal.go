package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// The write-ahead log makes a group of writes durable with one fdatasync of
// a preallocated file (~0.1 ms here), where a bbolt commit needs two plus its
// B+tree pages (~0.6 ms). bbolt stays the registry: the committer keeps one
// bbolt transaction open across many logged groups and commits it now and
// then (a checkpoint), after which the log starts again at offset 0.
//
// A record is one group: header [len u32][crc32c u32][seq u64], then len
// bytes of ops. The CRC covers seq and ops. Sequence numbers rise by one per
// record and never restart; bbolt stores the last one it holds, so recovery
// replays exactly the records after it. A log that starts again at offset 0
// leaves older records behind its tail: their sequence numbers do not follow
// on, so the scan stops there, as it does at a torn record.

const (
	walHeader = 16
	// walSize is preallocated (and written once with zeros, so that an
	// fdatasync never has to update file metadata).
	walSize = 8 << 20

	opPut byte = 1
	opDel byte = 2
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// wal is the append side of the log; only the committer goroutine uses it.
type wal struct {
	f    *os.File
	size int64
	off  int64
	seq  uint64 // last sequence number written
	buf  []byte
}

// openWAL opens (creating and preallocating if needed) the log at path.
func openWAL(path string, size int64) (*wal, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.Size() < size {
		created := st.Size() == 0
		zero := make([]byte, 1<<20)
		for off := st.Size(); off < size; off += int64(len(zero)) {
			n := min(int64(len(zero)), size-off)
			if _, err := f.WriteAt(zero[:n], off); err != nil {
				f.Close()
				return nil, err
			}
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		if created { // the new file's directory entry must survive a crash too
			if err := syncDir(filepath.Dir(path)); err != nil {
				f.Close()
				return nil, err
			}
		}
	} else {
		size = st.Size()
	}
	return &wal{f: f, size: size}, nil
}

// fits says whether a record with ops bytes fits behind the current tail.
func (l *wal) fits(ops int) bool { return l.off+walHeader+int64(ops) <= l.size }

// append writes one record and syncs it; the record is durable on return.
func (l *wal) append(ops []byte) error {
	seq := l.seq + 1
	l.buf = l.buf[:0]
	l.buf = binary.LittleEndian.AppendUint32(l.buf, uint32(len(ops)))
	l.buf = binary.LittleEndian.AppendUint32(l.buf, 0)
	l.buf = binary.LittleEndian.AppendUint64(l.buf, seq)
	l.buf = append(l.buf, ops...)
	binary.LittleEndian.PutUint32(l.buf[4:], crc32.Checksum(l.buf[8:], crcTable))
	if _, err := l.f.WriteAt(l.buf, l.off); err != nil {
		return err
	}
	if err := fdatasync(l.f); err != nil {
		return err
	}
	l.off += int64(len(l.buf))
	l.seq = seq
	if cap(l.buf) > 1<<20 {
		l.buf = nil // do not pin one huge group's buffer
	}
	return nil
}

// restart makes the next record go to offset 0; call it only once bbolt
// durably holds every record written so far.
func (l *wal) restart() { l.off = 0 }

func (l *wal) close() error { return l.f.Close() }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// scanWAL calls apply with the ops of each record after applied, in order,
// and returns the last sequence number it saw (applied if none).
//
// A record whose CRC does not match ends the log only if it is the tail:
// appends are synced one after the other, so a torn write is always the
// last record. If the record behind it is intact and follows on, the bad
// one was acknowledged and is corrupt, and the scan fails rather than
// silently drop it and what follows (open would then overwrite them).
func scanWAL(r io.ReaderAt, size int64, applied uint64, apply func(ops []byte) error) (uint64, error) {
	var off int64
	var prev uint64
	last := applied
	for off+walHeader <= size {
		seq, ops, next, err := readRecord(r, size, off)
		if err != nil {
			return last, fmt.Errorf("store: read write-ahead log at %d: %w", off, err)
		}
		if next == 0 || (prev != 0 && seq != prev+1) {
			break // end of log: zeros, or older records behind a restart
		}
		if ops == nil { // bad CRC
			if nseq, nops, _, err := readRecord(r, size, next); err == nil && nops != nil && nseq == seq+1 {
				return last, fmt.Errorf("store: write-ahead log record %d is corrupt (record %d follows it intact)", seq, nseq)
			}
			break // torn: this group was never acknowledged
		}
		if seq > applied {
			if seq != last+1 {
				return last, fmt.Errorf("store: write-ahead log jumps from record %d to %d", last, seq)
			}
			if err := apply(ops); err != nil {
				return last, fmt.Errorf("store: write-ahead log record %d: %w", seq, err)
			}
			last = seq
		}
		prev = seq
		off = next
	}
	return last, nil
}

// readRecord reads the record at off. next is 0 when there is none (a zero
// or impossible length); ops is nil when the CRC does not match. Only I/O
// errors are errors.
func readRecord(r io.ReaderAt, size, off int64) (seq uint64, ops []byte, next int64, err error) {
	var hdr [walHeader]byte
	if off+walHeader > size {
		return 0, nil, 0, nil
	}
	if _, err := r.ReadAt(hdr[:], off); err != nil {
		return 0, nil, 0, err
	}
	n := int64(binary.LittleEndian.Uint32(hdr[0:]))
	sum := binary.LittleEndian.Uint32(hdr[4:])
	seq = binary.LittleEndian.Uint64(hdr[8:])
	if n == 0 || off+walHeader+n > size {
		return seq, nil, 0, nil
	}
	rec := make([]byte, 8+n)
	copy(rec, hdr[8:])
	if _, err := r.ReadAt(rec[8:], off+walHeader); err != nil {
		return 0, nil, 0, err
	}
	next = off + walHeader + n
	if crc32.Checksum(rec, crcTable) != sum {
		return seq, nil, next, nil
	}
	return seq, rec[8:], next, nil
}

// appendOp encodes one put (val != nil) or delete into an ops buffer.
func appendOp(ops []byte, kind, bucket byte, key, val []byte) []byte {
	ops = append(ops, kind, bucket)
	ops = binary.AppendUvarint(ops, uint64(len(key)))
	ops = append(ops, key...)
	if kind == opPut {
		ops = binary.AppendUvarint(ops, uint64(len(val)))
		ops = append(ops, val...)
	}
	return ops
}

var errBadOps = errors.New("malformed ops")

// eachOp decodes an ops buffer written by appendOp.
func eachOp(ops []byte, fn func(kind, bucket byte, key, val []byte) error) error {
	for len(ops) > 0 {
		if len(ops) < 2 {
			return errBadOps
		}
		kind, bucket := ops[0], ops[1]
		ops = ops[2:]
		key, rest, ok := cutBytes(ops)
		if !ok {
			return errBadOps
		}
		ops = rest
		var val []byte
		switch kind {
		case opPut:
			if val, ops, ok = cutBytes(ops); !ok {
				return errBadOps
			}
		case opDel:
		default:
			return errBadOps
		}
		if err := fn(kind, bucket, key, val); err != nil {
			return err
		}
	}
	return nil
}

func cutBytes(b []byte) (field, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, false
	}
	return b[k : k+int(n)], b[k+int(n):], true
}
