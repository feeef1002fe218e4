// Package logpipe puts the worker between a sandbox's output and its log
// file, so that a flooding sandbox cannot fill the node's disk faster than
// the log's rotation can keep up (docs/operations.md, "Logs").
//
// The sandbox's stdout and stderr are a FIFO beside its log (LOG.pipe),
// which the sandbox holds open for reading and writing: it never sees a
// broken pipe, and when no worker drains it (across a worker restart) its
// writes wait in the pipe's buffer and then block until the next worker
// drains it again (Adopt). The worker copies what arrives into the log at
// most Limits.Rate bytes a second (Limits.Burst at once) and drops the
// rest, writing into the log how much it dropped. The FIFO goes when
// every process that held it has closed it: the sandbox has ended.
package logpipe

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits bound what one sandbox's output may put into its log.
type Limits struct {
	Rate  int64 // bytes a second, sustained
	Burst int64 // bytes at once
}

// Default lets a sandbox log 1 MiB a second with bursts of 8 MiB (within
// the 10 MiB its log holds before rotation): more than any function that
// logs for people, far less than a flood (a sandbox can write gigabytes a
// second).
var Default = Limits{Rate: 1 << 20, Burst: 8 << 20}

// Suffix names a log's FIFO: LOG + Suffix.
const Suffix = ".pipe"

// chunk is one read from the pipe.
const chunk = 16 << 10

// Open makes the FIFO of the log at path and starts draining it into the
// log. The caller gives w to the sandbox as its stdout and stderr and
// closes its own copy once the sandbox's process has it (or failed to
// start: the drain then ends and the FIFO goes).
func Open(path string, lim Limits, log *slog.Logger) (w *os.File, err error) {
	fifo := path + Suffix
	_ = os.Remove(fifo) // a dead sandbox's, of a reused id
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		return nil, fmt.Errorf("log pipe: %w", err)
	}
	// O_RDWR opens at once, with no reader waiting: the sandbox's end.
	w, err = os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		_ = os.Remove(fifo)
		return nil, fmt.Errorf("log pipe: %w", err)
	}
	if err := drain(path, lim, log); err != nil {
		w.Close()
		_ = os.Remove(fifo)
		return nil, err
	}
	return w, nil
}

// Sandbox is Open with the Default limits, the log's directory made
// (0700: only the worker reads sandboxes' output): what a runtime gives a
// sandbox, a template or a template's child as its output.
func Sandbox(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	return Open(path, Default, nil)
}

// Adopt drains the FIFO an earlier worker left for the log at path (its
// sandbox is adopted). Without one (a sandbox started before logs were
// piped, or already gone) it does nothing.
func Adopt(path string, lim Limits, log *slog.Logger) error {
	st, err := os.Lstat(path + Suffix)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode()&fs.ModeNamedPipe == 0 {
		return fmt.Errorf("log pipe %s: not a FIFO", path+Suffix)
	}
	return drain(path, lim, log)
}

// Move renames the log at from, its FIFO and a drain of it, to the log at
// to: a process started for one log (a Node standby, package forkserver)
// that becomes another's sandbox keeps its output descriptors, and its
// output goes on into the log now named to.
func Move(from, to string) error {
	drainsMu.Lock()
	defer drainsMu.Unlock()
	if err := os.Rename(from+Suffix, to+Suffix); err != nil {
		return fmt.Errorf("log pipe: %w", err)
	}
	if err := os.Rename(from, to); err != nil && !errors.Is(err, fs.ErrNotExist) {
		_ = os.Rename(to+Suffix, from+Suffix)
		return fmt.Errorf("log pipe: %w", err)
	}
	if d := drains[from]; d != nil {
		delete(drains, from)
		d.fifo = to + Suffix
		drains[to] = d
	}
	return nil
}

// A drain's FIFO path changes with Move.
type drainState struct{ fifo string }

var (
	drainsMu sync.Mutex
	drains   = map[string]*drainState{} // by log path
)

// drain opens the FIFO for reading and the log for appending, and copies
// one into the other until every writer has gone.
func drain(path string, lim Limits, log *slog.Logger) error {
	fifo := path + Suffix
	// Non-blocking: no writer need be there yet, and reads wait in Go's
	// poller, not on a thread.
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("log pipe: %w", err)
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		r.Close()
		return fmt.Errorf("log pipe: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &drainState{fifo: fifo}
	drainsMu.Lock()
	drains[path] = d
	drainsMu.Unlock()
	active.Add(1)
	go func() {
		defer active.Done()
		copyLimited(out, r, lim, time.Now)
		r.Close()
		out.Close()
		drainsMu.Lock()
		fifo := d.fifo
		if p := strings.TrimSuffix(fifo, Suffix); drains[p] == d {
			delete(drains, p)
		}
		drainsMu.Unlock()
		if err := os.Remove(fifo); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Warn("log pipe: removing the FIFO of an ended sandbox", "path", fifo, "err", err)
		}
	}()
	return nil
}

// active counts the drains running.
var active sync.WaitGroup

// Wait waits for every drain to end (tests: a sandbox's output is all in
// its log once its processes have ended and Wait returned).
func Wait() { active.Wait() }

// copyLimited copies r into out until r ends (every writer has closed
// the FIFO), within lim. While it drops, it writes a line into out at
// most once a second, and a second after the last drop, saying how much it
// dropped.
func copyLimited(out io.Writer, r *os.File, lim Limits, now func() time.Time) {
	buf := make([]byte, chunk)
	tokens, last := float64(lim.Burst), now()
	var dropped int64
	var noted time.Time
	midLine := false // the last byte written was not a newline
	note := func(t time.Time) {
		if midLine {
			_, _ = out.Write([]byte{'\n'})
		}
		fmt.Fprintf(out, "[brisk] %d bytes of this sandbox's output dropped: it wrote more than %d bytes a second\n", dropped, lim.Rate)
		dropped, noted, midLine = 0, t, false
	}
	for {
		// While there is a drop to report, wake up to report it even if
		// the sandbox writes nothing more.
		var wake time.Time
		if dropped > 0 {
			wake = noted.Add(time.Second)
		}
		_ = r.SetReadDeadline(wake)
		n, err := r.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			note(now())
			continue
		}
		if n > 0 {
			t := now()
			tokens = min(float64(lim.Burst), tokens+t.Sub(last).Seconds()*float64(lim.Rate))
			last = t
			keep := int64(min(float64(n), max(tokens, 0)))
			if keep > 0 {
				_, _ = out.Write(buf[:keep])
				tokens -= float64(keep)
				midLine = buf[keep-1] != '\n'
			}
			dropped += int64(n) - keep
			if dropped > 0 && t.Sub(noted) >= time.Second {
				note(t)
			}
		}
		if err != nil {
			break
		}
	}
	if dropped > 0 {
		note(now())
	}
}
