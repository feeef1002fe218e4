package worker

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
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

// logLimits bound the disk sandboxes' output takes (docs/operations.md,
// "Logs"). Sandboxes write their logs directly (no worker in the path, so
// a worker restart never blocks or breaks a function's output): the keeper
// enforces the limits every logCheck, so a flood overshoots a file's cap
// by at most what it writes in that time.
type logLimits struct {
	file      int64         // a live log past this is rotated (its last file bytes kept in .1)
	function  int64         // one function's logs, every sandbox's, together
	node      int64         // every log under the directory
	retention time.Duration // a finished sandbox's logs go after this without writes
}

var defaultLogLimits = logLimits{file: MaxLogBytes, function: 100 << 20, node: 2 << 30, retention: 24 * time.Hour}

const (
	logCheck = time.Second // live logs' sizes
	logSweep = 30          // every this many checks, the whole directory
)

// keepLogs holds the logs under dir to lim until ctx ends. live lists the
// sandboxes running now as function/sandbox pairs.
func keepLogs(ctx context.Context, dir string, lim logLimits, live func() map[string]string, log *slog.Logger) {
	t := time.NewTicker(logCheck)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		running := live()
		for sb, fn := range running {
			if dropped := capLog(filepath.Join(dir, fn, sb+".log"), lim.file); dropped > 0 {
				log.Warn("a sandbox's output outgrew its log: rotated, and what it wrote beyond the cap since the last check dropped",
					"function", fn, "sandbox", sb, "dropped_bytes", dropped, "cap_bytes", lim.file)
			}
		}
		if tick%logSweep == 0 {
			sweepLogs(dir, lim, running, time.Now(), log)
		}
	}
}

// capLog rotates the log at path once it is past max bytes: its last max
// bytes (from a line's start) go to path.1, streamed (never the whole file
// in memory), and the log is truncated in place (the sandbox holds it open
// for appending, so it writes on at the new start). What is beyond those
// bytes is dropped, and a line in the log says how much; lines written
// between the copy and the truncation are lost. It returns the bytes
// dropped.
func capLog(path string, max int64) int64 {
	st, err := os.Stat(path)
	if err != nil || st.Size() <= max {
		return 0
	}
	src, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer src.Close()
	size := st.Size()
	from := size - max - 1 // the byte before the kept ones
	// Start at a line: after the first newline at or after from.
	br := bufio.NewReader(io.NewSectionReader(src, from, size-from))
	skipped, err := br.ReadBytes('\n')
	if err != nil {
		skipped = []byte{0} // no newline: keep the last max bytes
		br = bufio.NewReader(io.NewSectionReader(src, from+1, size-from-1))
	}
	tmp := path + ".1.tmp"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0
	}
	_, cerr := io.Copy(dst, br)
	if err := dst.Close(); cerr != nil || err != nil {
		_ = os.Remove(tmp)
		return 0
	}
	if os.Rename(tmp, path+".1") != nil || os.Truncate(path, 0) != nil {
		_ = os.Remove(tmp)
		return 0
	}
	dropped := from + int64(len(skipped))
	if dropped > 0 {
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0); err == nil {
			fmt.Fprintf(f, "[brisk] %d bytes of this sandbox's output dropped: it wrote past its log's cap (%d bytes, checked every %v)\n", dropped, max, logCheck)
			f.Close()
		}
	}
	return dropped
}

// sweepLogs deletes, oldest first: finished sandboxes' logs past the
// retention; then, while a function's logs are past its cap, its finished
// sandboxes' logs and its rotated ones; then the same across the
// directory while it is past the node's budget, and at last it truncates
// the largest live logs.
func sweepLogs(dir string, lim logLimits, running map[string]string, now time.Time, log *slog.Logger) {
	type file struct {
		path, fn string
		size     int64
		mod      time.Time
		live     bool // the live log of a running sandbox (never deleted: it is open)
	}
	var all []file
	perFn := map[string]int64{}
	var total int64
	fns, _ := os.ReadDir(dir)
	for _, fe := range fns {
		if !fe.IsDir() {
			continue
		}
		ents, _ := os.ReadDir(filepath.Join(dir, fe.Name()))
		for _, e := range ents {
			info, err := e.Info()
			if err != nil || e.IsDir() || e.Type()&fs.ModeNamedPipe != 0 { // a live sandbox's pipe (logpipe): its drain removes it
				continue
			}
			sb, isLive := strings.CutSuffix(e.Name(), ".log")
			f := file{path: filepath.Join(dir, fe.Name(), e.Name()), fn: fe.Name(), size: info.Size(), mod: info.ModTime(),
				live: isLive && running[sb] == fe.Name()}
			if !f.live && now.Sub(f.mod) > lim.retention {
				if os.Remove(f.path) == nil {
					continue
				}
			}
			all = append(all, f)
			perFn[f.fn] += f.size
			total += f.size
		}
	}
	slices.SortFunc(all, func(a, b file) int { return a.mod.Compare(b.mod) })
	removed := 0
	drop := func(i int) {
		if os.Remove(all[i].path) == nil {
			perFn[all[i].fn] -= all[i].size
			total -= all[i].size
			all[i].size = 0
			removed++
		}
	}
	for i, f := range all {
		if !f.live && f.size > 0 && perFn[f.fn] > lim.function {
			drop(i)
		}
	}
	for i, f := range all {
		if !f.live && f.size > 0 && total > lim.node {
			drop(i)
		}
	}
	if total > lim.node { // only live logs left: the largest go first
		slices.SortFunc(all, func(a, b file) int { return cmp.Compare(b.size, a.size) })
		for _, f := range all {
			if total <= lim.node || !f.live || f.size == 0 {
				continue
			}
			if os.Truncate(f.path, 0) == nil {
				total -= f.size
				log.Warn("the node's logs outgrew their budget: a live sandbox's log truncated", "function", f.fn, "path", f.path, "bytes", f.size)
			}
		}
	}
	if removed > 0 {
		log.Info("logs removed to keep the caps", "files", removed, "dir", dir)
	}
}
