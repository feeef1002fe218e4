// Package ui is the control plane's web dashboard: a page, a script and a
// style sheet, embedded in the binary (no build step, nothing fetched from
// the internet), served at /ui/ by the admin API. The files carry no data
// and are served without a token; the page reads GET /v1/dashboard with
// the token the user gives it (#token=... in the URL, kept in the tab's
// sessionStorage).
package ui

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// file is one static file, read once.
type file struct {
	body        []byte
	contentType string
	etag        string
}

var files = func() map[string]file {
	out := map[string]file{}
	types := map[string]string{".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
	err := fs.WalkDir(static, "static", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := types[path.Ext(p)]
		if ct == "" {
			ct = "application/octet-stream"
		}
		out[strings.TrimPrefix(p, "static")] = file{body: b, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("ui: embedded files: " + err.Error()) // the embed is compiled in: cannot happen
	}
	out["/"] = out["/index.html"]
	return out
}()

// securityHeaders are on every answer: the page runs only its own script
// and style and talks only to its own origin (no inline code, so a
// function name or error message shown on it cannot become one), and no
// other site may frame it.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
}

// Handler serves the files at paths relative to the dashboard's root ("/"
// is the page): mount it with http.StripPrefix. The files change only with
// the binary, so they are revalidated on each load (ETag) rather than
// cached blindly across an upgrade.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		f, ok := files[r.URL.Path]
		if !ok {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte("no such file in the dashboard: " + r.URL.Path + "\n"))
			return
		}
		h := w.Header()
		h.Set("Content-Type", f.contentType)
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		if match := r.Header.Get("If-None-Match"); match != "" && match == f.etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(f.body)
	})
}
