package controlplane

import (
	"testing"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// A worker gets a function's secret values with its spec, once per
// session, and again only when they changed; a function naming none costs
// the link nothing more than before.
func TestSessionSendsSecretsWithSpecs(t *testing.T) {
	c := &Cluster{}
	c.setSecrets(map[string][]byte{"default/db": []byte("pw"), "team-a/db": []byte("other"), "default/api": []byte("k")})
	f := &spec.Function{Name: "f", Revision: 3, Secrets: []string{"db", "missing"}}
	plain := &spec.Function{Name: "plain", Revision: 1}
	s := newSession(1)

	data, gen := c.secretDataLocked(f)
	if len(data) != 1 || string(data["db"]) != "pw" {
		t.Fatalf("secret data: %q, want db=pw of the default namespace only (missing left out)", data)
	}
	s.create(f, "sb-1", data, gen)
	s.create(f, "sb-2", data, gen)
	if pd, pg := c.secretDataLocked(plain); pd != nil || pg != 0 {
		t.Fatalf("a function without secrets: %v %d", pd, pg)
	}
	s.create(plain, "sb-3", nil, 0)
	cmds := s.take()
	if len(cmds.Specs) != 2 || len(cmds.Creates) != 3 {
		t.Fatalf("first batch: %d specs, %d creates; want 2, 3", len(cmds.Specs), len(cmds.Creates))
	}
	if got := cmds.Specs[0].GetSecretData()["db"]; string(got) != "pw" || cmds.Specs[1].GetSecretData() != nil {
		t.Fatalf("specs on the wire: %v / %v", cmds.Specs[0].GetSecretData(), cmds.Specs[1].GetSecretData())
	}
	if back := spec.FromProto(cmds.Specs[0]); string(back.SecretData["db"]) != "pw" || len(back.Secrets) != 2 {
		t.Fatalf("worker's view of the spec: %+v", back)
	}
	// What data planes and the admin API get: never a value.
	if f.ToProto().GetSecretData() != nil {
		t.Fatal("the stored spec carries secret values")
	}

	// An update: the next create carries the spec again with the new value.
	c.setSecrets(map[string][]byte{"default/db": []byte("pw2")})
	data, gen = c.secretDataLocked(f)
	s.create(f, "sb-4", data, gen)
	s.offer(f, data, gen)
	s.create(plain, "sb-5", nil, 0)
	cmds = s.take()
	if len(cmds.Specs) != 1 || string(cmds.Specs[0].GetSecretData()["db"]) != "pw2" {
		t.Fatalf("after an update: %d specs %v, want one with pw2", len(cmds.Specs), cmds.Specs)
	}
}
