// Package dirigent serves Dirigent's registration contract (SOSP'24), so
// that the InVitro loader and other tools written for Dirigent drive brisk
// with one config line (docs/compatibility.md): a form POST to any path
// registers (or updates) a function and is answered 200 with the data
// planes' host:port list; GET .../check?name=F answers 200 once F is
// registered. Registrations go through the admin API's own handlers (the
// Admin the control plane gives), so the same token checks, spec
// validation, caps and quotas apply.
package dirigent

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Images says what a registered image runs as.
const (
	// ImagesTrace runs every registered image as the built-in trace
	// function (what the loader's images do: spin for requested_cpu ms and
	// answer ExecutionTime).
	ImagesTrace = "trace"
	// ImagesKeep deploys the image itself (containerd or native runtime,
	// the image imported on the workers).
	ImagesKeep = "keep"
)

// The loader registers a tenth of a function's peak memory
// (OvercommitmentRatio in its trace profiler; it asks Knative for the same
// figure as a request, with no limit) and its calls then ask for up to the
// peak (the requested_memory header). brisk places a sandbox by the
// registered figure; its limit is the peak the loader implies plus room
// for the function's own runtime, so that a call the loader sends is not
// OOM-killed for asking what its trace says.
const (
	loaderOvercommit = 10
	runtimeRoomMB    = 64
)

// memoryLimit is the limit of a function registered with requestMB,
// within the operator's cap (capMB, 0: none) and never below the request.
func memoryLimit(requestMB, capMB int64) int64 {
	// The request is bounded first, so that the product cannot overflow.
	limit := min(min(requestMB, tracefn.MaxMiB)*loaderOvercommit, tracefn.MaxMiB) + runtimeRoomMB
	if capMB > 0 {
		limit = min(limit, capMB)
	}
	return max(limit, requestMB)
}

// maxRegistrationBytes bounds one registration form.
const maxRegistrationBytes = 64 << 10

// Admin is brisk's side of the contract: the admin API's function
// handlers, run with the registering request's credentials, answering a
// status and a body; and the data planes' invocation addresses.
type Admin interface {
	CreateFunction(r *http.Request, body []byte) (int, []byte)
	UpdateFunction(r *http.Request, name string, body []byte) (int, []byte)
	GetFunction(r *http.Request, name string) (int, []byte)
	DataPlaneAddrs() ([]string, error)
}

// Config is how registrations become specs.
type Config struct {
	Images string // ImagesTrace ("" too) or ImagesKeep
	// KeepAlive, when set, is how long an idle sandbox of a registered
	// function lives (ttl keep-alive, as Dirigent's).
	KeepAlive time.Duration
	// MaxMemoryMB is the operator's cap on a sandbox's memory
	// (spec.Caps); a registration's memory limit stays within it.
	MaxMemoryMB int64
	// MaxQueueTimeout is the operator's cap on a spec's queue timeout
	// (spec.Caps): how long a registered function's calls wait for a
	// sandbox (0: brisk's default).
	MaxQueueTimeout time.Duration
	Log             *slog.Logger
}

// Handler serves the contract. The caller authenticates requests before
// it (the token may come as basic auth, which a registration address
// written user:TOKEN@host:port makes Go clients send).
func Handler(a Admin, cfg Config) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	h := &handler{admin: a, cfg: cfg}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/check") && r.Method == http.MethodGet:
			h.check(w, r)
		case strings.HasSuffix(r.URL.Path, "/workflow"):
			writeError(w, http.StatusNotImplemented, "brisk does not register workflows")
		case r.Method == http.MethodPost:
			h.register(w, r)
		case r.URL.Path == "/healthz":
			_, _ = io.WriteString(w, "ok\n")
		default:
			writeError(w, http.StatusMethodNotAllowed, "register with a form POST (Dirigent's contract); GET /check?name=F")
		}
	})
}

type handler struct {
	admin  Admin
	cfg    Config
	images sync.Map // images logged as mapped to the trace function
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]string{"error": msg})
}

func writeReply(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// spec builds a spec from a registration form.
func (h *handler) spec(form url.Values) (*spec.Function, error) {
	name := form.Get("name")
	if name == "" {
		return nil, fmt.Errorf("the form has no name")
	}
	f := &spec.Function{Name: name, Auth: spec.AuthPublic} // the loader sends no credentials with its calls
	if ka := h.cfg.KeepAlive; ka > 0 {
		// How long an idle sandbox lives: the stable window, and no grace
		// (Knative's rule: ttl, not the default gd).
		f.Scaling.StableWindow = spec.Duration(max(ka, time.Second))
		f.Scaling.ScaleToZeroGrace = spec.Duration(time.Millisecond)
		f.Scaling.KeepAlivePolicy = spec.KeepAliveTTL
	}
	if qt := h.cfg.MaxQueueTimeout; qt > 0 {
		// Dirigent's data plane holds a call waiting for a cold start until
		// its client gives up (the loader waits up to 900 s); brisk holds
		// it as long as the operator lets any function wait, so that a
		// burst of first calls on a full node is served late, not failed
		// at brisk's 30 s default.
		f.Queue.Timeout = spec.Duration(qt)
	}
	img := form.Get("image")
	switch {
	case h.cfg.Images == ImagesKeep && img != "":
		f.Image = img
	default:
		f.Builtin = "trace"
		if img != "" {
			if _, seen := h.images.LoadOrStore(img, true); !seen {
				h.cfg.Log.Info("registration: image runs as the built-in trace function (--dirigent-images keep deploys it)", "image", img)
			}
		}
	}
	num := func(field string, dst *int64) error {
		v := form.Get(field)
		if v == "" {
			return nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%s %q: want a non-negative integer", field, v)
		}
		*dst = n
		return nil
	}
	var port, hi, lo, cpu, mem int64
	if pf := form["port_forwarding"]; len(pf) > 0 {
		if err := num("port_forwarding", &port); err != nil {
			return nil, err
		}
	}
	for field, dst := range map[string]*int64{"scaling_upper_bound": &hi, "scaling_lower_bound": &lo, "requested_cpu": &cpu, "requested_memory": &mem} {
		if err := num(field, dst); err != nil {
			return nil, err
		}
	}
	f.Port, f.Scaling.Max, f.Scaling.Min = int(port), int(hi), int(lo)
	f.Resources.MilliCPU, f.Resources.MemoryMB = cpu, mem
	if mem > 0 {
		f.Limits.MemoryMB = memoryLimit(mem, h.cfg.MaxMemoryMB)
	}
	if f.Builtin != "" {
		f.Port = 0 // the trace function takes the port the runtime gives it
	}
	for _, kv := range form["env_vars"] {
		for pair := range strings.FieldsSeq(kv) {
			if k, v, ok := strings.Cut(pair, "="); ok && k != "" {
				if f.Env == nil {
					f.Env = map[string]string{}
				}
				f.Env[k] = v
			}
		}
	}
	return f, nil
}

func (h *handler) register(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRegistrationBytes)
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "registration form: "+err.Error())
		return
	}
	f, err := h.spec(r.PostForm)
	if err != nil {
		writeError(w, http.StatusBadRequest, "registration form: "+err.Error())
		return
	}
	body, _ := json.Marshal(f)
	code, reply := h.admin.CreateFunction(r, body)
	if code == http.StatusConflict { // registered before: the form replaces it
		code, reply = h.admin.UpdateFunction(r, f.Name, body)
	}
	if code/100 != 2 {
		writeReply(w, code, reply)
		return
	}
	addrs, err := h.admin.DataPlaneAddrs()
	h.cfg.Log.Info("registration", "function", f.Name, "builtin", f.Builtin, "image", f.Image, "min", f.Scaling.Min, "max", f.Scaling.Max,
		"cpu_milli", f.Resources.MilliCPU, "memory_mb", f.Resources.MemoryMB, "status", code, "data_planes", strings.Join(addrs, ";"))
	if err != nil || len(addrs) == 0 {
		writeError(w, http.StatusServiceUnavailable, "no data plane has registered yet")
		return
	}
	// Exactly 200 with the data planes: the loader counts anything else
	// as a failed registration.
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, strings.Join(addrs, ";"))
}

func (h *handler) check(w http.ResponseWriter, r *http.Request) {
	code, reply := h.admin.GetFunction(r, r.URL.Query().Get("name"))
	writeReply(w, code, reply)
}
