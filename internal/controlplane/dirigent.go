package controlplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Dirigent's registration contract (SOSP'24), so that the InVitro loader
// and other tools written for Dirigent drive brisk with one config line
// (docs/compatibility.md): a form POST to any path registers (or updates)
// a function and is answered 200 with the data planes' host:port list;
// GET .../check?name=F answers 200 once F is registered. Requests go
// through the admin API's own handlers, so the same token checks, spec
// validation, caps and quotas apply; the token may come as basic auth,
// which a registration address written nats-style (user:TOKEN@host:port)
// makes Go clients send.

// DirigentImages says what a registered image runs as.
const (
	// DirigentImagesTrace runs every registered image as the built-in
	// trace function (what the loader's images do: spin for requested_cpu
	// ms and answer ExecutionTime).
	DirigentImagesTrace = "trace"
	// DirigentImagesKeep deploys the image itself (containerd or native
	// runtime, the image imported on the workers).
	DirigentImagesKeep = "keep"
)

// maxRegistrationBytes bounds one registration form.
const maxRegistrationBytes = 64 << 10

func (cp *ControlPlane) dirigentHandler() http.Handler {
	h := cp.authenticate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/check") && r.Method == http.MethodGet:
			cp.dirigentCheck(w, r)
		case strings.HasSuffix(r.URL.Path, "/workflow"):
			writeError(w, http.StatusNotImplemented, "brisk does not register workflows")
		case r.Method == http.MethodPost:
			cp.dirigentRegister(w, r)
		case r.URL.Path == "/healthz":
			_, _ = io.WriteString(w, "ok\n")
		default:
			writeError(w, http.StatusMethodNotAllowed, "register with a form POST (Dirigent's contract); GET /check?name=F")
		}
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" && !cp.cfg.AuthDisabled && r.URL.Path != "/healthz" {
			// Tools written for Dirigent send no token; say how to give one.
			w.Header().Set("WWW-Authenticate", `Basic realm="brisk"`)
			writeError(w, http.StatusUnauthorized, "registration needs a brisk token with the deploy scope: write the registration address as user:TOKEN@host:port (the InVitro loader's DirigentControlPlaneIP), which Go's HTTP client sends as basic auth")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// dirigentSpec builds a spec from a registration form.
func (cp *ControlPlane) dirigentSpec(form url.Values) (*spec.Function, error) {
	name := form.Get("name")
	if name == "" {
		return nil, fmt.Errorf("the form has no name")
	}
	f := &spec.Function{Name: name, Auth: spec.AuthPublic} // the loader sends no credentials with its calls
	if ka := cp.cfg.DirigentKeepAlive; ka > 0 {
		// How long an idle sandbox lives: the stable window, and no grace
		// (Knative's rule: ttl, not the default gd).
		f.Scaling.StableWindow = spec.Duration(max(ka, time.Second))
		f.Scaling.ScaleToZeroGrace = spec.Duration(time.Millisecond)
		f.Scaling.KeepAlivePolicy = spec.KeepAliveTTL
	}
	img := form.Get("image")
	switch {
	case cp.cfg.DirigentImages == DirigentImagesKeep && img != "":
		f.Image = img
	default:
		f.Builtin = "trace"
		if img != "" {
			if _, seen := cp.dirigentImages.LoadOrStore(img, true); !seen {
				cp.log.Info("registration: image runs as the built-in trace function (--dirigent-images keep deploys it)", "image", img)
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

func (cp *ControlPlane) dirigentRegister(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRegistrationBytes)
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "registration form: "+err.Error())
		return
	}
	f, err := cp.dirigentSpec(r.PostForm)
	if err != nil {
		writeError(w, http.StatusBadRequest, "registration form: "+err.Error())
		return
	}
	body, _ := json.Marshal(f)
	code, reply := cp.serveInternal(r, http.MethodPost, "/v1/functions", "", body, cp.createFunction)
	if code == http.StatusConflict { // registered before: the form replaces it
		code, reply = cp.serveInternal(r, http.MethodPut, "/v1/functions/"+f.Name, f.Name, body, cp.updateFunction)
	}
	if code/100 != 2 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write(reply)
		return
	}
	addrs, err := cp.dataPlaneAddrs()
	cp.log.Info("registration", "function", f.Name, "builtin", f.Builtin, "image", f.Image, "min", f.Scaling.Min, "max", f.Scaling.Max,
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

func (cp *ControlPlane) dirigentCheck(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	code, reply := cp.serveInternal(r, http.MethodGet, "/v1/functions/"+name, name, nil, cp.getFunction)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(reply)
}

// dataPlaneAddrs lists the invocation addresses of the data planes that
// follow the endpoint stream now (all registered ones when none does).
func (cp *ControlPlane) dataPlaneAddrs() ([]string, error) {
	dps, err := cp.store.DataPlanes()
	if err != nil {
		return nil, err
	}
	c := cp.cluster
	c.mu.Lock()
	watching := map[string]bool{}
	for w := range c.watchers {
		watching[w.dpID] = true
	}
	c.mu.Unlock()
	var live, all []string
	for _, d := range dps {
		if d.Address == "" {
			continue
		}
		all = append(all, d.Address)
		if watching[d.ID] {
			live = append(live, d.Address)
		}
	}
	if len(live) > 0 {
		all = live
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}

// serveInternal runs an admin handler for a request made from r (its
// Authorization goes along) and returns the status and body.
func (cp *ControlPlane) serveInternal(r *http.Request, method, path, name string, body []byte, h http.HandlerFunc) (int, []byte) {
	req, _ := http.NewRequestWithContext(r.Context(), method, path, bytes.NewReader(body))
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	req.Header.Set("Content-Type", "application/json")
	if name != "" {
		req.SetPathValue("name", name)
	}
	rec := &bufferedReply{header: http.Header{}}
	h(rec, req)
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	return rec.code, rec.body.Bytes()
}

// bufferedReply is the ResponseWriter of serveInternal.
type bufferedReply struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedReply) Header() http.Header { return b.header }
func (b *bufferedReply) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}
func (b *bufferedReply) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.body.Write(p)
}
