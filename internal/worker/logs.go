package worker

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
)

// LogKeeper is implemented by runtimes that keep their sandboxes' output
// in files: LogDir()/FUNCTION/SANDBOX.log, each rotated to SANDBOX.log.1
// past MaxLogBytes.
type LogKeeper interface {
	LogDir() string
}

// MaxLogBytes is the size past which a sandbox's log is rotated: its
// content moves to SANDBOX.log.1 (replacing the one before) and the log
// starts again empty, so one sandbox keeps at most twice this much.
const MaxLogBytes = 10 << 20

const (
	logPoll     = 250 * time.Millisecond
	logMaxLine  = 64 << 10 // longer lines are cut
	rotateEvery = 10 * time.Second
)

// Logs streams a function's sandboxes' output (briskv1.Worker.Logs).
func (d *Daemon) Logs(req *briskv1.LogsRequest, stream briskv1.Worker_LogsServer) error {
	fn, sb := req.GetFunction(), req.GetSandbox()
	if !runtime.ValidName(fn) || (sb != "" && !runtime.ValidName(sb)) {
		return status.Error(codes.InvalidArgument, "logs: a function (and sandbox) name is required")
	}
	type src struct{ node, dir string }
	var srcs []src
	for id, n := range d.nodes {
		if req.GetNodeId() != "" && id != req.GetNodeId() {
			continue
		}
		for _, rt := range n.runtimes() {
			if lk, ok := rt.(LogKeeper); ok {
				srcs = append(srcs, src{id, filepath.Join(lk.LogDir(), fn)})
			}
		}
	}
	slices.SortFunc(srcs, func(a, b src) int { return strings.Compare(a.node, b.node) })
	since := time.UnixMilli(req.GetSinceUnixMs())
	offsets := map[string]int64{} // path -> bytes sent
	send := func(node, sandbox string, t time.Time, text string) error {
		return stream.Send(&briskv1.LogLine{NodeId: node, Function: fn, Sandbox: sandbox, TimeUnixMs: t.UnixMilli(), Text: text})
	}
	for _, s := range srcs {
		for _, f := range logFiles(s.dir, sb) {
			st, err := os.Stat(f.path)
			if err != nil {
				continue
			}
			offsets[f.path] = st.Size()
			if req.GetSinceUnixMs() > 0 && st.ModTime().Before(since) {
				continue
			}
			lines := lastLines(f.path, int(req.GetTail()))
			for _, l := range lines {
				if err := send(s.node, f.sandbox, st.ModTime(), l); err != nil {
					return err
				}
			}
		}
	}
	if !req.GetFollow() {
		return nil
	}
	if err := stream.Send(&briskv1.LogLine{Function: fn, BacklogEnd: true}); err != nil {
		return err
	}
	ctx := stream.Context()
	t := time.NewTicker(logPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, s := range srcs {
			for _, f := range logFiles(s.dir, sb) {
				if err := followFile(f.path, offsets, func(text string) error {
					return send(s.node, f.sandbox, time.Now(), text)
				}); err != nil {
					return err
				}
			}
		}
	}
}

type logFile struct{ path, sandbox string }

// logFiles lists dir's sandbox logs (one sandbox's with sb set), sorted.
func logFiles(dir, sb string) []logFile {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []logFile
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok || e.IsDir() || (sb != "" && id != sb) {
			continue
		}
		out = append(out, logFile{filepath.Join(dir, e.Name()), id})
	}
	return out
}

// lastLines returns the last n lines (n <= 0: all) of a log and, before
// them, of its rotated predecessor.
func lastLines(path string, n int) []string {
	lines := readLines(path)
	if n <= 0 || len(lines) < n {
		older := readLines(path + ".1")
		lines = append(older, lines...)
	}
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

func readLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(f, 2*MaxLogBytes))
	sc.Buffer(make([]byte, 0, 64<<10), logMaxLine)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// followFile sends the whole lines written to path since offsets[path];
// a log that shrank was rotated and is read from its start.
func followFile(path string, offsets map[string]int64, emit func(string) error) error {
	st, err := os.Stat(path)
	if err != nil {
		return nil
	}
	off, known := offsets[path]
	if !known {
		off = 0 // a sandbox started while following
	}
	if st.Size() < off {
		off = 0
	}
	if st.Size() == off {
		offsets[path] = off
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	buf := make([]byte, min(st.Size()-off, 1<<20))
	k, _ := f.ReadAt(buf, off)
	buf = buf[:k]
	end := bytes.LastIndexByte(buf, '\n')
	if end < 0 {
		if len(buf) < logMaxLine {
			offsets[path] = off // a partial line: wait for its end
			return nil
		}
		end = len(buf) - 1 // a line longer than we keep: cut it
	}
	for _, l := range bytes.Split(buf[:end], []byte{'\n'}) {
		if len(l) > logMaxLine {
			l = l[:logMaxLine]
		}
		if err := emit(string(l)); err != nil {
			return err
		}
	}
	offsets[path] = off + int64(end) + 1
	return nil
}

// rotateLogs keeps every log under LogDir below max bytes until ctx ends:
// a log past it is copied to LOG.1 and truncated in place (the sandbox
// holds it open for appending, so it writes on at the new end). Lines
// written between the copy and the truncation are lost.
func rotateLogs(ctx context.Context, dir string, max int64) {
	t := time.NewTicker(rotateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rotateOnce(dir, max)
	}
}

func rotateOnce(dir string, max int64) {
	fns, _ := os.ReadDir(dir)
	for _, fe := range fns {
		if !fe.IsDir() {
			continue
		}
		for _, f := range logFiles(filepath.Join(dir, fe.Name()), "") {
			st, err := os.Stat(f.path)
			if err != nil || st.Size() <= max {
				continue
			}
			data, err := os.ReadFile(f.path)
			if err != nil {
				continue
			}
			if os.WriteFile(f.path+".1", data, 0o600) == nil {
				_ = os.Truncate(f.path, 0)
			}
		}
	}
}
