package admin

import (
	"bytes"
	"net/http"
	"slices"

	"github.com/brisk-faas/brisk/internal/compat/dirigent"
)

// DirigentHandler serves Dirigent's registration contract
// (internal/compat/dirigent) behind the admin API's authentication.
func (srv *API) DirigentHandler() http.Handler {
	h := srv.authenticate(dirigent.Handler(dirigentAdmin{srv}, dirigent.Config{Images: srv.cfg.DirigentImages,
		KeepAlive: srv.cfg.DirigentKeepAlive, MaxMemoryMB: srv.cfg.Caps.MaxMemoryMB,
		MaxQueueTimeout: srv.cfg.Caps.MaxQueueTimeout, Log: srv.log}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" && !srv.cfg.AuthDisabled && r.URL.Path != "/healthz" {
			// Tools written for Dirigent send no token; say how to give one.
			w.Header().Set("WWW-Authenticate", `Basic realm="brisk"`)
			WriteError(w, http.StatusUnauthorized, "registration needs a brisk token with the deploy scope: write the registration address as user:TOKEN@host:port (the InVitro loader's DirigentControlPlaneIP), which Go's HTTP client sends as basic auth")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// dirigentAdmin runs the admin API's handlers for registrations.
type dirigentAdmin struct{ srv *API }

func (a dirigentAdmin) CreateFunction(r *http.Request, body []byte) (int, []byte) {
	return a.srv.serveInternal(r, http.MethodPost, "/v1/functions", "", body, a.srv.createFunction)
}

func (a dirigentAdmin) UpdateFunction(r *http.Request, name string, body []byte) (int, []byte) {
	return a.srv.serveInternal(r, http.MethodPut, "/v1/functions/"+name, name, body, a.srv.updateFunction)
}

func (a dirigentAdmin) GetFunction(r *http.Request, name string) (int, []byte) {
	return a.srv.serveInternal(r, http.MethodGet, "/v1/functions/"+name, name, nil, a.srv.getFunction)
}

func (a dirigentAdmin) DataPlaneAddrs() ([]string, error) { return a.srv.dataPlaneAddrs() }

// dataPlaneAddrs lists the invocation addresses of the data planes that
// follow the endpoint stream now (all registered ones when none does).
func (srv *API) dataPlaneAddrs() ([]string, error) {
	dps, err := srv.store.DataPlanes()
	if err != nil {
		return nil, err
	}
	watching := srv.cluster.WatchedDataPlanes()
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
func (srv *API) serveInternal(r *http.Request, method, path, name string, body []byte, h http.HandlerFunc) (int, []byte) {
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
