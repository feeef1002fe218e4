package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// noCheckpoints keeps every write in the log only, as a crash would find it.
var noCheckpoints = options{logSize: walSize, checkpointIdle: time.Hour, checkpointEvery: time.Hour}

// crashCopy copies the registry files of a live store, which is what a
// power cut would leave on disk: bbolt up to its last checkpoint plus the log.
func crashCopy(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	for _, name := range []string{"registry.db", "registry.wal"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

func mustOpen(t *testing.T, dir string, o options) *Store {
	t.Helper()
	s, err := open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func names(t *testing.T, s *Store) string {
	t.Helper()
	fns, err := s.Functions()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fns {
		out = append(out, fmt.Sprintf("%s@%d", f.Name, f.Revision))
	}
	return strings.Join(out, ",")
}

func TestAcknowledgedWritesSurviveCrashBeforeCheckpoint(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, noCheckpoints)
	for _, n := range []string{"a", "b", "c", "d"} {
		if _, err := s.CreateFunction(fn(n)); err != nil {
			t.Fatal(err)
		}
	}
	b := fn("b")
	b.Revision = 2
	if err := s.UpdateFunction(b); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteFunction("c"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutWorker(&Worker{ID: "w1", Address: "127.0.0.1:1", Drain: true}); err != nil {
		t.Fatal(err)
	}
	crashed := crashCopy(t, dir)

	r := mustOpen(t, crashed, noCheckpoints)
	if got := names(t, r); got != "a@1,b@2,d@1" {
		t.Fatalf("after crash: functions %s, want a@1,b@2,d@1", got)
	}
	ws, err := r.Workers()
	if err != nil || len(ws) != 1 || !ws[0].Drain {
		t.Fatalf("after crash: workers %+v, %v", ws, err)
	}
	// Recovery checkpointed: a second crash copy, with nothing new, agrees.
	if got := names(t, mustOpen(t, crashCopy(t, crashed), noCheckpoints)); got != "a@1,b@2,d@1" {
		t.Fatalf("after second crash: %s", got)
	}
}

func TestConcurrentWritersSurviveCrash(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, noCheckpoints)
	var wg sync.WaitGroup
	for c := range 16 {
		wg.Go(func() {
			for i := range 50 {
				if _, err := s.CreateFunction(fn(fmt.Sprintf("f-%02d-%02d", c, i))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if s.log.seq >= 800 {
		t.Errorf("%d log records for 800 writes: no group commit", s.log.seq)
	}
	fns, err := mustOpen(t, crashCopy(t, dir), noCheckpoints).Functions()
	if err != nil || len(fns) != 800 {
		t.Fatalf("after crash: %d of 800 functions, %v", len(fns), err)
	}
}

func TestRestartedLogDoesNotReplayOlderRecords(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, noCheckpoints)
	for i := range 20 {
		if _, err := s.CreateFunction(fn(fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	names(t, s) // a read checkpoints: the log starts again at offset 0
	if s.log.off != 0 {
		t.Fatalf("log tail at %d after checkpoint, want 0", s.log.off)
	}
	if err := s.DeleteFunction("f00"); err != nil {
		t.Fatal(err)
	}
	b := fn("f01")
	b.Revision = 3
	if err := s.UpdateFunction(b); err != nil {
		t.Fatal(err)
	}
	// Behind the two new records lie 18 older ones, among them f00's and
	// f01's creation.
	got := names(t, mustOpen(t, crashCopy(t, dir), noCheckpoints))
	if strings.Contains(got, "f00") || !strings.HasPrefix(got, "f01@3,f02@1") || strings.Count(got, ",") != 18 {
		t.Fatalf("after crash: %s", got)
	}
}

func TestTornRecordIsNotReplayed(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, noCheckpoints)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := s.CreateFunction(fn(n)); err != nil {
			t.Fatal(err)
		}
	}
	tail := s.log.off
	crashed := crashCopy(t, dir)
	// The last record lost its final byte: the power went during its write.
	f, err := os.OpenFile(filepath.Join(crashed, "registry.wal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, tail-1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := names(t, mustOpen(t, crashed, noCheckpoints)); got != "a@1,b@1" {
		t.Fatalf("after a torn record: %s, want a@1,b@1", got)
	}
}

func TestGroupLargerThanLogIsDurable(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, options{logSize: 4096, checkpointIdle: time.Hour, checkpointEvery: time.Hour})
	if _, err := s.CreateFunction(fn("small")); err != nil {
		t.Fatal(err)
	}
	big := fn("big")
	big.Env = map[string]string{"BLOB": strings.Repeat("x", 8000)}
	if _, err := s.CreateFunction(big); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFunction(fn("after")); err != nil {
		t.Fatal(err)
	}
	r := mustOpen(t, crashCopy(t, dir), noCheckpoints)
	if got := names(t, r); got != "after@1,big@1,small@1" {
		t.Fatalf("after crash: %s", got)
	}
	if _, err := r.CreateFunction(fn("big")); !errors.Is(err, ErrExists) {
		t.Fatalf("re-create of recovered function: %v, want ErrExists", err)
	}
}

func TestIdleStoreCheckpoints(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, options{logSize: walSize, checkpointIdle: time.Millisecond, checkpointEvery: time.Hour})
	if _, err := s.CreateFunction(fn("a")); err != nil {
		t.Fatal(err)
	}
	// Without any read or further write, bbolt alone comes to hold "a".
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found bool
		s.db.View(func(tx *bolt.Tx) error {
			found = tx.Bucket(bucketFunctions).Get([]byte("a")) != nil
			return nil
		})
		if found {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint 10 s after the last write")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCorruptRecordMidLogFailsOpen(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, noCheckpoints)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := s.CreateFunction(fn(n)); err != nil {
			t.Fatal(err)
		}
	}
	crashed := crashCopy(t, dir)
	// A bit flips in the first record; the ones behind it are intact, so
	// it was acknowledged and dropping it (and them) would lose writes.
	f, err := os.OpenFile(filepath.Join(crashed, "registry.wal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, walHeader+1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	before, _ := os.ReadFile(filepath.Join(crashed, "registry.wal"))
	if r, err := open(crashed, noCheckpoints); err == nil {
		r.Close()
		t.Fatal("open succeeded over a corrupt acknowledged record")
	} else if !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("error %q does not say the log is corrupt", err)
	}
	after, _ := os.ReadFile(filepath.Join(crashed, "registry.wal"))
	if string(before) != string(after) {
		t.Fatal("a failed open rewrote the log")
	}
}

func TestCallsAfterCloseFail(t *testing.T) {
	s, err := open(t.TempDir(), noCheckpoints)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFunction(fn("a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFunction(fn("b")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Functions(); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v, want ErrClosed", err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}
}

func TestBackupHoldsLoggedWrites(t *testing.T) {
	s := mustOpen(t, t.TempDir(), noCheckpoints) // writes stay in the log
	for _, n := range []string{"a", "b"} {
		if _, err := s.CreateFunction(fn(n)); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	var size int64 = -1
	n, err := s.Backup(&buf, func(n int64) { size = n })
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) || size != n {
		t.Fatalf("backup wrote %d bytes, buffer holds %d, announced %d", n, buf.Len(), size)
	}
	if _, err := s.CreateFunction(fn("c")); err != nil { // after the backup
		t.Fatal(err)
	}
	restored := t.TempDir()
	if err := os.WriteFile(filepath.Join(restored, "registry.db"), buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	r := mustOpen(t, restored, noCheckpoints)
	if got := names(t, r); got != "a@1,b@1" {
		t.Fatalf("restored %s, want a@1,b@1", got)
	}
	// The restored registry takes writes and keeps them across a restart.
	if _, err := r.CreateFunction(fn("d")); err != nil {
		t.Fatal(err)
	}
	if got := names(t, mustOpen(t, crashCopy(t, restored), noCheckpoints)); got != "a@1,b@1,d@1" {
		t.Fatalf("after a write and a crash: %s, want a@1,b@1,d@1", got)
	}
}
