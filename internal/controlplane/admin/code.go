package admin

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// uploadCode serves POST /v1/code: a zip archive of a function's source,
// checked (codezip.Open) and kept in the registry under its digest, which
// a spec's code.digest then names. Any token that may deploy may upload:
// archives are named by their content, so one tenant's upload tells
// another nothing it could not compute from the bytes themselves.
func (srv *API) uploadCode(w http.ResponseWriter, r *http.Request) {
	if !srv.cfg.AuthDisabled {
		tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
		if err := auth.HasScope(srv.tokens, tok, auth.ScopeDeploy); err != nil {
			if errors.Is(err, auth.ErrForbidden) {
				WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s: its scopes do not allow deploy, which uploading code needs", auth.ID(tok)))
			} else {
				WriteError(w, http.StatusUnauthorized, err.Error())
			}
			return
		}
	}
	data, err := readBody(w, r, spec.MaxCodeBytes)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("code archive larger than %d MiB (put large dependencies in an image)", spec.MaxCodeBytes>>20))
		} else {
			WriteError(w, http.StatusBadRequest, "reading body: "+err.Error())
		}
		return
	}
	a, err := codezip.Open(data)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	d := codezip.Digest(data)
	if held, err := srv.store.CodeBytes(); err != nil {
		writeStoreError(w, "reading code: ", err)
		return
	} else if held+int64(len(data)) > spec.MaxCodeTotalBytes {
		if _, err := srv.store.Code(d); err != nil { // the same archive again is no more
			WriteError(w, http.StatusInsufficientStorage, fmt.Sprintf("the registry holds %d MiB of code archives, the most it keeps is %d MiB: delete functions whose code is no longer run", held>>20, spec.MaxCodeTotalBytes>>20))
			return
		}
	}
	if err := srv.store.PutCode(d, data); err != nil {
		writeStoreError(w, "storing code: ", err)
		return
	}
	writeCompactJSON(w, http.StatusCreated, api.CodeUpload{Digest: d, Size: int64(len(data)), Files: len(a.Files), UnpackedSize: a.Size})
}

// checkCode refuses (400) a spec whose code is not uploaded or lacks its
// handler's module; on refusal it has answered.
func (srv *API) checkCode(w http.ResponseWriter, c *spec.Code) bool {
	data, err := srv.store.Code(c.Digest)
	if errors.Is(err, store.ErrNotFound) {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid function spec: code.digest: %s has not been uploaded (POST /v1/code)", c.Digest))
		return false
	}
	if err != nil {
		writeStoreError(w, "reading code: ", err)
		return false
	}
	a, err := codezip.Open(data)
	if err == nil {
		err = a.CheckHandler(c)
	}
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid function spec: code: "+err.Error())
		return false
	}
	return true
}

// codeOf is the digests of the code archives function name and its kept
// revisions run.
func (srv *API) codeOf(name string) map[string]bool {
	out := map[string]bool{}
	if f := srv.cluster.Spec(name); f != nil && f.Code != nil {
		out[f.Code.Digest] = true
	}
	revs, _ := srv.store.Revisions(name)
	for _, f := range revs {
		if f.Code != nil {
			out[f.Code.Digest] = true
		}
	}
	return out
}

// dropUnusedCode deletes, of digests (those of a function just deleted),
// the archives no function or kept revision runs any more. Only those:
// an archive uploaded for a deploy still to come stays.
func (srv *API) dropUnusedCode(digests map[string]bool) {
	if len(digests) == 0 {
		return
	}
	fns, err := srv.store.Functions()
	if err != nil {
		srv.log.Warn("code archives of a deleted function kept", "err", err)
		return
	}
	for _, f := range fns {
		for d := range srv.codeOf(f.Name) {
			delete(digests, d)
		}
		if len(digests) == 0 {
			return
		}
	}
	for d := range digests {
		if err := srv.store.DeleteCode(d); err != nil && !errors.Is(err, store.ErrNotFound) {
			srv.log.Warn("code archive of a deleted function kept", "digest", d, "err", err)
		}
	}
}
