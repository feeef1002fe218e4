package tracefn

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The classic OpenFaaS watchdog, for functions deployed with an
// envProcess (fprocess) and no image brisk can run: each request forks
// fprocess with the request body on stdin and the request in its
// environment (Http_Method, Http_Query, Http_Path, Http_<Header> with '-'
// as '_'); what it writes to stdout is the reply. A process that fails
// answers 500 with its stderr. The lines it logs are the classic
// watchdog's ("Forking fprocess.", "Wrote N Bytes"), which OpenFaaS tools
// look for.

// EnvBuiltin names the built-in a sandbox runs ("watchdog"; unset: trace).
const EnvBuiltin = "BRISK_BUILTIN"

// Watchdog is the built-in's name.
const Watchdog = "watchdog"

// watchdog serves one fprocess.
type watchdog struct {
	argv    []string
	ctype   string        // content_type: the reply's Content-Type
	timeout time.Duration // exec_timeout; 0: none
	maxBody int64
	log     io.Writer
}

// NewWatchdog returns the handler running fprocess (split on white space,
// no shell) per request. getenv supplies content_type and exec_timeout.
func NewWatchdog(fprocess string, getenv func(string) string, log io.Writer) (http.Handler, error) {
	argv := strings.Fields(fprocess)
	if len(argv) == 0 {
		return nil, fmt.Errorf("watchdog: fprocess is empty")
	}
	w := &watchdog{argv: argv, ctype: getenv("content_type"), maxBody: DefaultMaxBody, log: log}
	if t := getenv("exec_timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil {
			return nil, fmt.Errorf("watchdog: exec_timeout %q: %w", t, err)
		}
		w.timeout = d
	}
	return w, nil
}

func (w *watchdog) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/_/health" {
		_, _ = io.WriteString(rw, "OK")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, w.maxBody))
	if err != nil {
		http.Error(rw, "reading the request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	if w.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.timeout)
		defer cancel()
	}
	start := time.Now()
	fmt.Fprintln(w.log, "Forking fprocess.")
	cmd := exec.CommandContext(ctx, w.argv[0], w.argv[1:]...)
	cmd.Env = append(os.Environ(), requestEnv(r)...)
	cmd.Stdin = bytes.NewReader(body)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(w.log, "fprocess failed: %v: %s\n", err, bytes.TrimSpace(errOut.Bytes()))
		msg := errOut.String()
		if msg == "" {
			msg = err.Error()
		}
		http.Error(rw, msg, http.StatusInternalServerError)
		return
	}
	if errOut.Len() > 0 {
		fmt.Fprintf(w.log, "stderr: %s\n", bytes.TrimSpace(errOut.Bytes()))
	}
	ct := w.ctype
	if ct == "" {
		ct = "text/plain; charset=utf-8"
	}
	rw.Header().Set("Content-Type", ct)
	rw.Header().Set("X-Duration-Seconds", fmt.Sprintf("%f", time.Since(start).Seconds()))
	_, _ = rw.Write(out.Bytes())
	fmt.Fprintf(w.log, "Wrote %d Bytes - Duration: %f seconds\n", out.Len(), time.Since(start).Seconds())
}

// requestEnv is the request as the classic watchdog's CGI-style variables.
func requestEnv(r *http.Request) []string {
	env := make([]string, 0, len(r.Header)+4)
	for k, v := range r.Header {
		if len(v) > 0 {
			env = append(env, "Http_"+strings.ReplaceAll(k, "-", "_")+"="+v[0])
		}
	}
	env = append(env, "Http_Method="+r.Method)
	if r.URL.RawQuery != "" {
		env = append(env, "Http_Query="+r.URL.RawQuery)
	}
	if r.URL.Path != "" {
		env = append(env, "Http_Path="+r.URL.Path)
	}
	return env
}
