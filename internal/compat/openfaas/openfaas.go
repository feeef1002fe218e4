// Package openfaas serves the OpenFaaS gateway's management API
// (/system/...) over brisk's admin API, so that faas-cli and other OpenFaaS
// tools manage brisk functions unmodified (docs/compatibility.md). Each
// request is forwarded with the caller's own credentials (basic auth with a
// brisk token as the password, as faas-cli login sends, or a bearer token):
// the admin API checks them as for any client.
package openfaas

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// DefaultNamespace is OpenFaaS's function namespace; brisk maps it to its
// own default namespace both ways.
const DefaultNamespace = "openfaas-fn"

// Label and annotation keys brisk reads or keeps.
const (
	labelScaleMin = "com.openfaas.scale.min"
	labelScaleMax = "com.openfaas.scale.max"
	labelZero     = "com.openfaas.scale.zero"
	labelFunction = "faas_function"
	annAuth       = "brisk.dev/auth"
	annRunImage   = "brisk.dev/run-image" // "true": run the image even with an envProcess
	// Fields of a FunctionDeployment brisk has no place for are kept in
	// annotations under this prefix (and hidden from what is returned).
	keepPrefix = "openfaas.brisk.dev/"
)

// Function is what a deployment and a status say of a function alike.
type Function struct {
	Image                  string            `json:"image"`
	Namespace              string            `json:"namespace,omitempty"`
	EnvProcess             string            `json:"envProcess,omitempty"`
	EnvVars                map[string]string `json:"envVars,omitempty"`
	Constraints            []string          `json:"constraints,omitempty"`
	Secrets                []string          `json:"secrets,omitempty"`
	Labels                 map[string]string `json:"labels,omitempty"`
	Annotations            map[string]string `json:"annotations,omitempty"`
	Limits                 *Resources        `json:"limits,omitempty"`
	Requests               *Resources        `json:"requests,omitempty"`
	ReadOnlyRootFilesystem bool              `json:"readOnlyRootFilesystem"`
}

// FunctionDeployment is what faas-cli deploys (POST/PUT /system/functions).
type FunctionDeployment struct {
	Service string `json:"service"`
	Function
}

// Resources are OpenFaaS's quantity strings ("64Mi", "100m").
type Resources struct {
	Memory string `json:"memory,omitempty"`
	CPU    string `json:"cpu,omitempty"`
}

// FunctionStatus is what the gateway reports of a function.
type FunctionStatus struct {
	Name string `json:"name"`
	Function
	// Annotations are always there, {} for none, as OpenFaaS's providers
	// send them: Go clients of its API read the map without a nil check.
	Annotations       map[string]string `json:"annotations"`
	InvocationCount   float64           `json:"invocationCount"`
	Replicas          uint64            `json:"replicas"`
	AvailableReplicas uint64            `json:"availableReplicas"`
	CreatedAt         time.Time         `json:"createdAt"`
}

// Info is /system/info's provider version.
type Info struct {
	Version, SHA string
}

// Handler serves /system/* by calling the admin API at admin with
// httpClient (which must trust the admin API's certificate, if any).
type Handler struct {
	admin string
	hc    *http.Client
	info  Info
	// HostCheck: see WithHostCheck.
	HostCheck bool
}

// New returns the handler.
func New(admin string, hc *http.Client, info Info) *Handler {
	if hc == nil {
		hc = &http.Client{Timeout: time.Minute}
	}
	return &Handler{admin: admin, hc: hc, info: info}
}

// WithHostCheck makes the handler refuse requests whose Host is a name other
// than localhost (auth.Forged): for an admin API without tokens.
func (h *Handler) WithHostCheck(on bool) *Handler {
	h.HostCheck = on
	return h
}

func (h *Handler) client(r *http.Request) *client.Client {
	c := client.New(h.admin, "")
	c.HTTP = h.hc
	c.Authorization = r.Header.Get("Authorization")
	return c
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Forwarded to the admin API from here, a page's request would no
	// longer look like one there.
	if status, why := auth.Forged(r, h.HostCheck); status != 0 {
		fail(w, status, why)
		return
	}
	p := r.URL.Path
	switch {
	case p == "/system/functions":
		switch r.Method {
		case http.MethodGet:
			h.list(w, r)
		case http.MethodPost, http.MethodPut:
			h.deploy(w, r)
		case http.MethodDelete:
			h.remove(w, r)
		default:
			fail(w, http.StatusMethodNotAllowed, "GET, POST, PUT or DELETE")
		}
	case strings.HasPrefix(p, "/system/function/") && r.Method == http.MethodGet:
		h.get(w, r, fullName(strings.TrimPrefix(p, "/system/function/"), r.URL.Query().Get("namespace")))
	case strings.HasPrefix(p, "/system/scale-function/") && r.Method == http.MethodPost:
		h.scale(w, r, strings.TrimPrefix(p, "/system/scale-function/"))
	case p == "/system/info" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"provider": map[string]any{"provider": "brisk", "orchestration": "brisk", "version": map[string]string{"release": h.info.Version, "sha": h.info.SHA}},
			"version":  map[string]string{"release": h.info.Version, "sha": h.info.SHA},
			"arch":     "x86_64",
		})
	case p == "/system/namespaces" && r.Method == http.MethodGet:
		h.namespaces(w, r)
	case p == "/system/logs" && r.Method == http.MethodGet:
		h.logs(w, r)
	case p == "/system/secrets":
		h.secrets(w, r)
	default:
		fail(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+p)
	}
}

// fail answers as the gateway does: a plain-text message.
func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg+"\n")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// failFrom answers an admin API error with its status and message.
func failFrom(w http.ResponseWriter, err error) {
	var e *client.Error
	if errors.As(err, &e) {
		fail(w, e.Status, e.Message)
		return
	}
	fail(w, http.StatusBadGateway, err.Error())
}

// fullName is brisk's name of OpenFaaS's function name in namespace ns
// (NAME.NAMESPACE outside the default one, spec.Qualify).
func fullName(name, ns string) string { return spec.Qualify(name, briskNS(ns)) }

// briskNS and faasNS map namespaces between the two.
func briskNS(ns string) string {
	if ns == DefaultNamespace {
		return ""
	}
	return ns
}

func faasNS(ns string) string {
	if ns == "" || ns == spec.DefaultNamespace {
		return DefaultNamespace
	}
	return ns
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	views, err := h.client(r).List(r.Context())
	if err != nil {
		failFrom(w, err)
		return
	}
	want := r.URL.Query().Get("namespace")
	out := []FunctionStatus{}
	for i := range views {
		st := ToStatus(&views[i])
		if want == "" || st.Namespace == want {
			out = append(out, st)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, name string) {
	v, err := h.client(r).Get(r.Context(), name)
	if err != nil {
		failFrom(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ToStatus(v))
}

func (h *Handler) deploy(w http.ResponseWriter, r *http.Request) {
	var d FunctionDeployment
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&d); err != nil {
		fail(w, http.StatusBadRequest, "FunctionDeployment: "+err.Error())
		return
	}
	f, err := ToSpec(&d)
	if err != nil {
		fail(w, http.StatusBadRequest, err.Error())
		return
	}
	cl := h.client(r)
	if r.Method == http.MethodPut {
		// faas-cli updates first and creates on 404.
		if _, err := cl.Update(r.Context(), f); err != nil {
			failFrom(w, err)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if _, err := cl.Create(r.Context(), f); err != nil {
		failFrom(w, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

func (h *Handler) remove(w http.ResponseWriter, r *http.Request) {
	var req struct {
		FunctionName string `json:"functionName"`
		Namespace    string `json:"namespace"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || req.FunctionName == "" {
		fail(w, http.StatusBadRequest, `want {"functionName": "NAME"}`)
		return
	}
	if err := h.client(r).Delete(r.Context(), fullName(req.FunctionName, cmp.Or(req.Namespace, r.URL.Query().Get("namespace")))); err != nil {
		failFrom(w, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// scale sets the function's minimum to the replicas asked for (brisk's
// autoscaler keeps at least that many and may add more up to the maximum).
func (h *Handler) scale(w http.ResponseWriter, r *http.Request, name string) {
	var req struct {
		Replicas  uint64 `json:"replicas"`
		Namespace string `json:"namespace"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || req.Replicas > math.MaxInt32 {
		fail(w, http.StatusBadRequest, `want {"serviceName": "NAME", "replicas": N}`)
		return
	}
	name = fullName(name, cmp.Or(req.Namespace, r.URL.Query().Get("namespace")))
	cl := h.client(r)
	v, err := cl.Get(r.Context(), name)
	if err != nil {
		failFrom(w, err)
		return
	}
	f := v.Function
	f.Scaling.Min = int(req.Replicas)
	if f.Scaling.Max != 0 && f.Scaling.Max < f.Scaling.Min {
		f.Scaling.Max = f.Scaling.Min
	}
	if _, err := cl.Update(r.Context(), f); err != nil {
		failFrom(w, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// logs answers /system/logs?name=&follow=&since=&tail=&instance= with the
// gateway's NDJSON lines.
func (h *Handler) logs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name := q.Get("name")
	if name == "" {
		fail(w, http.StatusBadRequest, "name is required")
		return
	}
	short, name := name, fullName(name, q.Get("namespace"))
	o := client.LogOptions{Follow: q.Get("follow") == "true", Sandbox: q.Get("instance"), Since: q.Get("since")}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < -1 {
			fail(w, http.StatusBadRequest, "tail: want a line count (-1: all)")
			return
		}
		o.Tail = max(n, 0) // faas-cli sends -1 for "all"
	}
	cl := h.client(r)
	v, err := cl.Get(r.Context(), name)
	if err != nil {
		failFrom(w, err)
		return
	}
	ns := faasNS(v.Namespace)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	started := false
	err = cl.Logs(r.Context(), name, o, func(l api.LogLine) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			_ = rc.SetWriteDeadline(time.Time{})
			started = true
		}
		if err := enc.Encode(map[string]any{"name": short, "namespace": ns, "instance": l.Sandbox, "timestamp": l.Time, "text": l.Text}); err != nil {
			return err
		}
		return rc.Flush()
	})
	if !started {
		if err != nil {
			failFrom(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
	}
}

func (h *Handler) namespaces(w http.ResponseWriter, r *http.Request) {
	nss, err := h.client(r).Namespaces(r.Context())
	if err != nil {
		failFrom(w, err)
		return
	}
	out := []string{}
	for _, n := range nss {
		out = append(out, faasNS(n.Name))
	}
	writeJSON(w, http.StatusOK, out)
}

// ToSpec converts a deployment to a brisk spec.
func ToSpec(d *FunctionDeployment) (*spec.Function, error) {
	if d.Service == "" {
		return nil, errors.New("service (the function's name) is required")
	}
	// OpenFaaS functions are public: faas-cli and the gateway's callers
	// send no credentials. The annotation brisk.dev/auth: token keeps
	// brisk's default.
	f := &spec.Function{Name: d.Service, Namespace: briskNS(d.Namespace), Image: d.Image, WritableRoot: !d.ReadOnlyRootFilesystem, Auth: spec.AuthPublic}
	if d.Annotations[annAuth] == spec.AuthToken {
		f.Auth = spec.AuthToken
	}
	switch b, ok := strings.CutPrefix(d.Image, spec.BuiltinImagePrefix); {
	case d.Image == "":
		return nil, errors.New("image is required")
	case ok:
		f.Image, f.Builtin = "", b
	case d.EnvProcess != "" && d.Annotations[annRunImage] != "true":
		// A classic-watchdog function: brisk forks its fprocess itself,
		// with no image (the image is kept for what is shown).
		f.Image, f.Builtin = "", "watchdog"
		defer func() {
			if f.Annotations == nil {
				f.Annotations = map[string]string{}
			}
			f.Annotations[keepPrefix+"image"] = d.Image
		}()
	}
	if len(d.EnvVars) > 0 || d.EnvProcess != "" {
		f.Env = map[string]string{}
		for k, v := range d.EnvVars {
			f.Env[k] = v
		}
		if d.EnvProcess != "" {
			f.Env["fprocess"] = d.EnvProcess // what the classic watchdog reads
		}
	}
	f.Labels = copyMap(d.Labels)
	f.Annotations = copyMap(d.Annotations)
	for k := range f.Annotations {
		if strings.HasPrefix(k, keepPrefix) {
			return nil, fmt.Errorf("annotation %s: the prefix %s is brisk's", k, keepPrefix)
		}
	}
	keep := func(k string, v []string) {
		if len(v) > 0 {
			if f.Annotations == nil {
				f.Annotations = map[string]string{}
			}
			b, _ := json.Marshal(v)
			f.Annotations[keepPrefix+k] = string(b)
		}
	}
	keep("constraints", d.Constraints)
	f.Secrets = d.Secrets
	if v, ok := d.Labels[labelScaleMin]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("label %s: %q is not a count", labelScaleMin, v)
		}
		f.Scaling.Min = n
	}
	if v, ok := d.Labels[labelScaleMax]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("label %s: %q is not a count", labelScaleMax, v)
		}
		f.Scaling.Max = n
	}
	// OpenFaaS runs every function with a replica from its deployment on
	// (tools wait for availableReplicas >= 1: faas-cli ready, CI
	// pipelines, the certifier), unless scale to zero is asked for.
	if _, set := d.Labels[labelScaleMin]; !set && d.Labels[labelZero] != "true" {
		f.Scaling.Min = max(f.Scaling.Min, 1)
	}
	if d.Labels[labelZero] == "false" && f.Scaling.Min == 0 {
		f.Scaling.Min = 1
	}
	var err error
	if r := d.Requests; r != nil {
		if f.Resources.MilliCPU, err = spec.ParseMilliCPU(r.CPU); err == nil {
			f.Resources.MemoryMB, err = spec.ParseMemoryMB(r.Memory)
		}
	}
	if r := d.Limits; r != nil && err == nil {
		if f.Limits.MilliCPU, err = spec.ParseMilliCPU(r.CPU); err == nil {
			f.Limits.MemoryMB, err = spec.ParseMemoryMB(r.Memory)
		}
	}
	return f, err
}

// ToStatus converts a brisk function to the gateway's status. replicas is
// the autoscaler's desired count, as a Deployment's spec.replicas;
// availableReplicas its ready sandboxes up to that count. Idle sandboxes the
// keep-alive policy holds beyond it are a warm cache, not replicas: counted,
// a function would read as scaled up for the keep-alive's 15 minutes after
// its load (docs/compatibility.md).
func ToStatus(v *api.FunctionView) FunctionStatus {
	f := v.Function
	st := FunctionStatus{Name: spec.ShortName(f.Name), Function: Function{Image: f.Image, Namespace: faasNS(f.Namespace), ReadOnlyRootFilesystem: !f.WritableRoot},
		Replicas: uint64(max(v.Status.Desired, 0)), AvailableReplicas: uint64(max(min(v.Status.Ready, v.Status.Desired), 0)), CreatedAt: f.CreatedAt,
		InvocationCount: float64(v.Status.Calls)}
	if st.Image == "" && f.Builtin != "" {
		st.Image = spec.BuiltinImagePrefix + f.Builtin
	}
	for k, val := range f.Env {
		if k == "fprocess" {
			st.EnvProcess = val
			continue
		}
		if st.EnvVars == nil {
			st.EnvVars = map[string]string{}
		}
		st.EnvVars[k] = val
	}
	if len(f.Secrets) > 0 {
		st.Secrets = slices.Clone(f.Secrets)
	}
	st.Labels = copyMap(f.Labels)
	if st.Labels == nil {
		st.Labels = map[string]string{}
	}
	st.Labels[labelFunction] = st.Name
	st.Annotations = map[string]string{}
	for k, val := range f.Annotations {
		switch k {
		case keepPrefix + "constraints":
			_ = json.Unmarshal([]byte(val), &st.Constraints)
		case keepPrefix + "secrets": // kept by releases before secrets were served
			if len(f.Secrets) == 0 {
				_ = json.Unmarshal([]byte(val), &st.Secrets)
			}
		case keepPrefix + "image":
			st.Image = val
		default:
			st.Annotations[k] = val
		}
	}
	// brisk's own defaults are not requests the deployment made (OpenFaaS
	// shows none then).
	if f.Resources != (spec.Resources{}) && f.Resources != (spec.Resources{MilliCPU: spec.DefaultMilliCPU, MemoryMB: spec.DefaultMemoryMB}) {
		st.Requests = &Resources{Memory: memString(f.Resources.MemoryMB), CPU: cpuString(f.Resources.MilliCPU)}
	}
	if f.Limits != (spec.Resources{}) {
		st.Limits = &Resources{Memory: memString(f.Limits.MemoryMB), CPU: cpuString(f.Limits.MilliCPU)}
	}
	return st
}

func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func memString(mb int64) string {
	if mb == 0 {
		return ""
	}
	return strconv.FormatInt(mb, 10) + "Mi"
}

func cpuString(m int64) string {
	if m == 0 {
		return ""
	}
	return strconv.FormatInt(m, 10) + "m"
}

// Secret is the gateway's secret: a value (text) or a raw value (bytes,
// base64 in JSON).
type Secret struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Value     string `json:"value,omitempty"`
	RawValue  []byte `json:"rawValue,omitempty"`
}

// secrets serves /system/secrets over brisk's secrets: list (names only),
// create, update and remove, as faas-cli secret does.
func (h *Handler) secrets(w http.ResponseWriter, r *http.Request) {
	c := h.client(r)
	ns := briskNS(r.URL.Query().Get("namespace"))
	if r.Method == http.MethodGet {
		views, err := c.Secrets(r.Context(), orDefault(ns))
		if err != nil {
			failFrom(w, err)
			return
		}
		out := []Secret{}
		for _, v := range views {
			out = append(out, Secret{Name: v.Name, Namespace: faasNS(v.Namespace)})
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	var s Secret
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 2*spec.MaxSecretSize))
	if err := dec.Decode(&s); err != nil {
		fail(w, http.StatusBadRequest, "malformed secret JSON: "+err.Error())
		return
	}
	if s.Name == "" {
		fail(w, http.StatusBadRequest, "name is required")
		return
	}
	if s.Namespace != "" {
		ns = briskNS(s.Namespace)
	}
	req := api.SecretRequest{Name: s.Name, Namespace: orDefault(ns), Value: s.Value, RawValue: s.RawValue}
	if len(s.RawValue) > 0 {
		// faas-cli's --from-file sends the file both ways; the bytes are
		// the value (OpenFaaS's providers take rawValue first).
		req.Value = ""
	}
	var err error
	code := http.StatusOK
	switch r.Method {
	case http.MethodPost:
		_, err = c.CreateSecret(r.Context(), req)
		code = http.StatusCreated
	case http.MethodPut:
		_, err = c.UpdateSecret(r.Context(), req)
	case http.MethodDelete:
		err = c.DeleteSecret(r.Context(), req.Namespace, s.Name)
		code = http.StatusAccepted
	default:
		fail(w, http.StatusMethodNotAllowed, "GET, POST, PUT or DELETE")
		return
	}
	if err != nil {
		failFrom(w, err)
		return
	}
	w.WriteHeader(code)
}

// orDefault names brisk's default namespace where OpenFaaS's maps to "".
func orDefault(ns string) string {
	if ns == "" {
		return spec.DefaultNamespace
	}
	return ns
}
