// Package secretsprobe is what the runtimes' test functions (the process
// runtime's echoserver, the native runtime's probe, the containerd
// runtime's echo image) answer on Path: what a sandbox sees of its secrets,
// for runtimetest's Secrets case. It links only the standard library, as
// those static test binaries do.
package secretsprobe

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
)

// Path is where the test functions serve the report.
const Path = "/secrets"

// Dir is spec.SecretsDir (runtimetest checks that they agree), and EnvDir
// runtime.EnvSecretsDir: this package must not import either.
const (
	Dir    = "/var/openfaas/secrets"
	EnvDir = "BRISK_SECRETS_DIR"
)

// Report is what a sandbox sees of its secrets.
type Report struct {
	// Env is $BRISK_SECRETS_DIR; Dir where the report looked: Env, or
	// the package's Dir when Env is empty.
	Env string `json:"env"`
	Dir string `json:"dir"`
	// Files holds the content of each regular file in Dir, Modes the
	// mode of each entry (fs.FileMode's String), regular or not.
	Files map[string][]byte `json:"files"`
	Modes map[string]string `json:"modes"`
	// ReadErr is why Dir or a file in it could not be read.
	ReadErr string `json:"read_err,omitempty"`
	// CreateErr is the error of creating a new file in Dir, WriteErr of
	// opening its first file for writing; "" means the write went
	// through.
	CreateErr string `json:"create_err"`
	WriteErr  string `json:"write_err"`
	// Flags are those of statfs(2) on Dir that say how it is mounted:
	// "ro", "nosuid", "nodev", "noexec".
	Flags []string `json:"flags"`
	UID   int      `json:"uid"`
}

// Read reports what this process sees.
func Read() Report {
	r := Report{Env: os.Getenv(EnvDir), Files: map[string][]byte{}, Modes: map[string]string{}, UID: os.Getuid()}
	r.Dir = r.Env
	if r.Dir == "" {
		r.Dir = Dir
	}
	ents, err := os.ReadDir(r.Dir)
	if err != nil {
		r.ReadErr = err.Error()
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(r.Dir, e.Name())
		st, err := os.Lstat(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.Modes[e.Name()] = st.Mode().String()
		if !st.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.Files[e.Name()] = b
	}
	if err := errors.Join(errs...); err != nil {
		r.ReadErr = err.Error()
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(r.Dir, &st); err == nil {
		for _, f := range []struct {
			bit  int64
			name string
		}{{1, "ro"}, {2, "nosuid"}, {4, "nodev"}, {8, "noexec"}} { // ST_RDONLY, ST_NOSUID, ST_NODEV, ST_NOEXEC
			if st.Flags&f.bit != 0 {
				r.Flags = append(r.Flags, f.name)
			}
		}
	}
	r.CreateErr = errText(write(filepath.Join(r.Dir, "written-by-the-sandbox"), os.O_CREATE|os.O_EXCL))
	r.WriteErr = "no file to write to"
	if len(ents) > 0 {
		r.WriteErr = errText(write(filepath.Join(r.Dir, ents[0].Name()), os.O_APPEND))
	}
	return r
}

func write(p string, flag int) error {
	f, err := os.OpenFile(p, os.O_WRONLY|flag, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte("x"))
	return errors.Join(err, f.Close())
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// ServeHTTP answers the Report as JSON.
func ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Read())
}
