package native

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest/secretsprobe"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func TestSecretsDirAgrees(t *testing.T) {
	if nsinit.SecretsDir != spec.SecretsDir {
		t.Fatalf("nsinit.SecretsDir %q, spec.SecretsDir %q", nsinit.SecretsDir, spec.SecretsDir)
	}
}

// The most secrets a function may have, one of them as large as a secret
// may be, reach the sandbox whole, in an image as well as on the host's
// root: their values travel beside the bind message, whose size bound they
// would break many times over.
func TestSecretsLargest(t *testing.T) {
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	importProbe(t, r)
	big := make([]byte, spec.MaxSecretSize)
	for i := range big {
		big[i] = byte(i * 7)
	}
	data := map[string][]byte{"big": big}
	names := []string{"big"}
	for i := len(names); i < spec.MaxSecretsPerFunction; i++ {
		name := fmt.Sprintf("s-%02d", i)
		data[name] = []byte(name)
		names = append(names, name)
	}
	for _, f := range []*spec.Function{probeFn("largest"), {Name: "largest-img", Revision: 1, Image: probeRef, Port: 8080}} {
		f.Secrets, f.SecretData = names, data
		f.Resources.MemoryMB = 256
		id := f.Name + "-1"
		inst := start(t, r, id, f)
		resp, err := http.Get("http://" + inst.Addr + secretsprobe.Path)
		if err != nil {
			t.Fatal(err)
		}
		var rep secretsprobe.Report
		err = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Files) != len(data) || rep.ReadErr != "" {
			t.Errorf("%s: %d files (%s), want %d", f.Name, len(rep.Files), rep.ReadErr, len(data))
		}
		for name, v := range data {
			if !bytes.Equal(rep.Files[name], v) {
				t.Errorf("%s: %s reads %d bytes, want the %d written", f.Name, name, len(rep.Files[name]), len(v))
			}
		}
		if err := r.Kill(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	// One byte more does not start.
	f := probeFn("too-large")
	f.Secrets, f.SecretData = []string{"big"}, map[string][]byte{"big": append(big, 0)}
	if _, err := r.Create(context.Background(), runtime.Spec{ID: "too-large-1", Function: f}); err == nil {
		t.Error("Create with a secret over spec.MaxSecretSize succeeded")
	}
}
