package emulated

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
)

// HeaderSandbox names the sandbox a request is for. The data plane sets it
// on every proxied request; the emulated host needs it because all its
// sandboxes share one address.
const HeaderSandbox = "X-Brisk-Sandbox"

// Server timeouts for Run; the write timeout outlasts the longest trace
// request.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = time.Minute
	writeTimeout      = tracefn.MaxMillis*time.Millisecond + time.Minute
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	shutdownGrace     = 5 * time.Second
)

// Host is the listener and sandbox table shared by every emulated node in
// the process. Sandbox ids are globally unique, so one table serves all
// nodes. It is safe for concurrent use.
type Host struct {
	log  *slog.Logger
	l    net.Listener
	addr string
	// ran is set by the first Run or Close: exactly one of them owns the
	// listener.
	ran atomic.Bool
	// sandboxes maps id to *sandbox. Dispatch reads it on every request and
	// Create and Kill write it, from many goroutines at once; sync.Map
	// shards that contention without a lock around the whole table.
	sandboxes sync.Map
}

// sandbox is one emulated sandbox: a table entry and a trace handler, no
// goroutine.
type sandbox struct {
	id, function string
	revision     uint64
	h            http.Handler
}

// NewHost binds listen (e.g. "127.0.0.1:0") so that Addr is known at once,
// but serves nothing until Run. Call Close instead if Run will not run.
func NewHost(listen string, logger *slog.Logger) (*Host, error) {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("emulated host: %w", err)
	}
	return &Host{
		log:  cmp.Or(logger, slog.New(slog.DiscardHandler)),
		l:    l,
		addr: l.Addr().String(),
	}, nil
}

// Addr is the host:port every emulated sandbox is reached at.
func (h *Host) Addr() string { return h.addr }

// Run serves the sandboxes until ctx ends, then shuts the server down,
// giving in-flight requests a few seconds. It returns nil after a clean
// shutdown; it can run once per Host.
func (h *Host) Run(ctx context.Context) error {
	if !h.ran.CompareAndSwap(false, true) {
		return errors.New("emulated host: Run after Run or Close")
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(h.serveHTTP),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(h.l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("emulated host: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("emulated host: %w", err)
	}
	return nil
}

// Close releases the listener of a Host that Run never served. After Run
// has started it does nothing: ending Run's ctx stops the host.
func (h *Host) Close() error {
	if !h.ran.CompareAndSwap(false, true) {
		return nil
	}
	return h.l.Close()
}

// serveHTTP dispatches on HeaderSandbox. A request for a sandbox the host
// does not know (never created, or killed) is the data plane routing to a
// dead backend, so it answers 502 as a proxy would.
func (h *Host) serveHTTP(w http.ResponseWriter, r *http.Request) {
	ids := r.Header[HeaderSandbox] // canonical already
	if len(ids) == 0 {
		if r.Method == http.MethodGet && r.URL.Path == "/healthz" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		http.Error(w, "emulated host: missing "+HeaderSandbox+" header", http.StatusBadGateway)
		return
	}
	v, ok := h.sandboxes.Load(ids[0])
	if !ok {
		http.Error(w, fmt.Sprintf("emulated host: no sandbox %q", ids[0]), http.StatusBadGateway)
		return
	}
	v.(*sandbox).h.ServeHTTP(w, r)
}

// Runtime returns the runtime of one emulated node. createDelay emulates
// the node's cold start: each Create waits that long. Call it once per node:
// each Runtime lists only the sandboxes it created.
func (h *Host) Runtime(nodeID string, createDelay time.Duration) *Runtime {
	return &Runtime{h: h, node: nodeID, delay: createDelay}
}

// Runtime is one emulated node's runtime. Its sandboxes run the trace
// function by sleeping, whatever the function spec says, and never end on
// their own, so Instance.Exited is nil. It is safe for concurrent use.
type Runtime struct {
	h     *Host
	node  string
	delay time.Duration

	mu  sync.Mutex
	ids map[string]*sandbox
}

var _ runtime.Runtime = (*Runtime)(nil)

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "emulated" }

// Node is the node id the runtime was made for.
func (r *Runtime) Node() string { return r.node }

// noExit is every emulated Instance's ExitErr: they never end on their own.
func noExit() error { return nil }

// Create waits the node's create delay (or until ctx ends) and registers the
// sandbox with the host. A function's secrets (Function.Secrets) are not
// written anywhere: an emulated sandbox runs no process and has no file
// system to find them in.
func (r *Runtime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	if s.ID == "" || s.Function == nil {
		return nil, fmt.Errorf("emulated sandbox %q: id and function are required", s.ID)
	}
	if r.delay > 0 {
		t := time.NewTimer(r.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("emulated sandbox %s: %w", s.ID, ctx.Err())
		}
	} else if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("emulated sandbox %s: %w", s.ID, err)
	}
	sb := &sandbox{
		id:       s.ID,
		function: s.Function.Name,
		revision: s.Function.Revision,
		h:        tracefn.New(tracefn.Config{SandboxID: s.ID, Function: s.Function.Name, Sleep: true}),
	}
	if _, taken := r.h.sandboxes.LoadOrStore(s.ID, sb); taken {
		return nil, fmt.Errorf("emulated sandbox %s: already exists", s.ID)
	}
	r.mu.Lock()
	if r.ids == nil {
		r.ids = make(map[string]*sandbox)
	}
	r.ids[s.ID] = sb
	r.mu.Unlock()
	return &runtime.Instance{ID: s.ID, Addr: r.h.addr, ExitErr: noExit, Ready: true}, nil
}

// Kill unregisters the sandbox; requests for it then get 502. Requests
// already running finish.
func (r *Runtime) Kill(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("emulated sandbox %s: %w", id, err)
	}
	r.mu.Lock()
	sb := r.ids[id]
	delete(r.ids, id)
	r.mu.Unlock()
	if sb == nil {
		return fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	r.h.sandboxes.CompareAndDelete(id, sb)
	return nil
}

// List returns this node's sandboxes, sorted by id; all are running.
func (r *Runtime) List(ctx context.Context) ([]runtime.Listed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	out := make([]runtime.Listed, 0, len(r.ids))
	for _, sb := range r.ids {
		out = append(out, runtime.Listed{ID: sb.id, Function: sb.function, Revision: sb.revision, Addr: r.h.addr, Running: true})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b runtime.Listed) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}
