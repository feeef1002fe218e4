package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/api"
)

// maxLogBacklog bounds the log lines held to cut a function's backlog to
// its tail.
const maxLogBacklog = 64 << 20

// streamRecheck is how often a long-lived stream's token is checked again:
// a revoked token, or one whose function went, ends it within this.
const streamRecheck = time.Second

// recheckStream calls cancel once the request's token no longer allows
// reading function name's logs (revoked, or the function deleted or moved
// to a namespace the token is not bound to), until ctx ends.
func (srv *API) recheckStream(ctx context.Context, cancel context.CancelFunc, r *http.Request, name string) {
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	ns := srv.namespaceOfFn(name)
	t := time.NewTicker(streamRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		gone := srv.namespaceOfFn(name) != ns
		if gone || (!srv.cfg.AuthDisabled && auth.Check(srv.tokens, tok, auth.ScopeDeploy, ns, name) != nil) {
			srv.log.Info("a followed log stream ended: its token or function is gone", "function", name, "token", auth.ID(tok))
			cancel()
			return
		}
	}
}

// functionLogs serves GET /v1/functions/NAME/logs: the output of the
// function's sandboxes, gathered from every connected worker (each keeps
// the logs of the sandboxes it ran), as NDJSON api.LogLine, flushed line
// by line. Query: tail (the last lines of the function's logs, of all its
// sandboxes together; -1 or 0: all that is kept), since (a duration, or
// RFC 3339 time), sandbox, follow=true (keep streaming until the client
// leaves).
func (srv *API) functionLogs(w http.ResponseWriter, r *http.Request) {
	name := srv.pathFunction(r)
	if !srv.authorize(w, r, auth.ScopeDeploy, srv.namespaceOfFn(name), name) {
		return
	}
	f := srv.cluster.Spec(name)
	if f == nil {
		WriteError(w, http.StatusNotFound, "function "+quote(name)+" not found")
		return
	}
	q := r.URL.Query()
	req := &briskv1.LogsRequest{Function: name, Sandbox: q.Get("sandbox"), Follow: q.Get("follow") == "true"}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 || n > 1_000_000 {
			WriteError(w, http.StatusBadRequest, "tail "+quote(v)+": want a line count (-1: all)")
			return
		}
		req.Tail = int32(max(n, 0)) // faas-cli's default, -1, is "all"
	}
	if v := q.Get("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			req.SinceUnixMs = time.Now().Add(-d).UnixMilli()
		} else if t, err := time.Parse(time.RFC3339, v); err == nil {
			req.SinceUnixMs = t.UnixMilli()
		} else {
			WriteError(w, http.StatusBadRequest, "since "+quote(v)+": want a duration (10m) or an RFC 3339 time")
			return
		}
	}
	// Never the logs of an earlier function of this name (deleted, perhaps
	// another tenant's): only sandboxes written to since this one was made.
	if !f.CreatedAt.IsZero() {
		req.SinceUnixMs = max(req.SinceUnixMs, f.CreatedAt.UnixMilli())
	}
	ctx := r.Context()
	if !req.Follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go srv.recheckStream(ctx, cancel, r, name)
	}
	lines := make(chan *briskv1.LogLine, 256)
	var wg sync.WaitGroup
	streams := 0
	for id, conn := range srv.cluster.WorkerConns() {
		wg.Add(1)
		streams++
		go func(id string) {
			defer wg.Done()
			// Every stream ends its backlog once: with the worker's mark,
			// or by ending.
			marked := false
			defer func() {
				if !marked {
					select {
					case lines <- &briskv1.LogLine{BacklogEnd: true}:
					case <-ctx.Done():
					}
				}
			}()
			cctx := metadata.AppendToOutgoingContext(ctx, "brisk-node", id)
			nreq := &briskv1.LogsRequest{NodeId: id, Function: req.Function, Sandbox: req.Sandbox, Tail: req.Tail, SinceUnixMs: req.SinceUnixMs, Follow: req.Follow}
			stream, err := briskv1.NewWorkerClient(conn).Logs(cctx, nreq)
			if err != nil {
				return
			}
			for {
				l, err := stream.Recv()
				if err != nil {
					if !errors.Is(err, io.EOF) && ctx.Err() == nil {
						srv.log.Debug("logs from a worker ended", "node", id, "err", err)
					}
					return
				}
				if l.GetBacklogEnd() {
					if marked {
						continue
					}
					marked = true
				}
				select {
				case lines <- l:
				case <-ctx.Done():
					return
				}
			}
		}(id)
	}
	go func() { wg.Wait(); close(lines) }()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // a followed stream outlives the server's write timeout
	enc := json.NewEncoder(w)
	emit := func(l *briskv1.LogLine) {
		_ = enc.Encode(api.LogLine{Function: l.GetFunction(), Sandbox: l.GetSandbox(), Node: l.GetNodeId(),
			Time: time.UnixMilli(l.GetTimeUnixMs()).UTC(), Text: l.GetText()})
	}
	// With a tail, the backlog (each worker's last tail lines of each
	// sandbox) is cut to the function's last tail lines, oldest first,
	// before new lines flow; held up to maxLogBacklog bytes, past which it
	// goes out as it is.
	var (
		backlog      []*briskv1.LogLine
		backlogBytes int
	)
	if req.Tail == 0 {
		streams = 0
	}
	flushBacklog := func() {
		slices.SortStableFunc(backlog, func(a, b *briskv1.LogLine) int { return cmp.Compare(a.GetTimeUnixMs(), b.GetTimeUnixMs()) })
		if len(backlog) > int(req.Tail) {
			backlog = backlog[len(backlog)-int(req.Tail):]
		}
		for _, b := range backlog {
			emit(b)
		}
		backlog, streams = nil, 0
	}
	for l := range lines {
		switch {
		case streams > 0 && l.GetBacklogEnd():
			if streams--; streams == 0 {
				flushBacklog()
			}
		case l.GetBacklogEnd():
		case streams > 0:
			backlog = append(backlog, l)
			if backlogBytes += len(l.GetText()) + 64; backlogBytes > maxLogBacklog {
				flushBacklog()
				break
			}
			continue
		default:
			emit(l)
		}
		if len(lines) == 0 {
			_ = rc.Flush()
		}
	}
	if len(backlog) > 0 { // a stream that ended without its mark (ctx)
		flushBacklog()
	}
}
