package controlplane

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/specpb"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// A worker gets a function's secret values with its spec, once per
// session, and again only when they changed; a function naming none costs
// the link nothing more than before.
func TestSessionSendsSecretsWithSpecs(t *testing.T) {
	c := &Cluster{}
	c.SetSecrets([]*store.Secret{{Namespace: "default", Name: "db", Value: []byte("pw")}, {Namespace: "team-a", Name: "db", Value: []byte("other")}, {Namespace: "default", Name: "api", Value: []byte("k")}})
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
	if back := specpb.FromProto(cmds.Specs[0]); string(back.SecretData["db"]) != "pw" || len(back.Secrets) != 2 {
		t.Fatalf("worker's view of the spec: %+v", back)
	}
	// What data planes and the admin API get: never a value.
	if specpb.ToProto(f).GetSecretData() != nil {
		t.Fatal("the stored spec carries secret values")
	}

	// An update: the next create carries the spec again with the new value.
	c.PutSecret("default/db", &store.Secret{Namespace: "default", Name: "db", Value: []byte("pw2")})
	data, gen = c.secretDataLocked(f)
	s.create(f, "sb-4", data, gen)
	s.offer(f, data, gen)
	s.create(plain, "sb-5", nil, 0)
	cmds = s.take()
	if len(cmds.Specs) != 1 || string(cmds.Specs[0].GetSecretData()["db"]) != "pw2" {
		t.Fatalf("after an update: %d specs %v, want one with pw2", len(cmds.Specs), cmds.Specs)
	}
}

// A worker's gRPC server takes messages of up to 64 MiB (rpc.ServerOptions),
// and a session queues many specs at once (a handshake offers every
// dual-mode function): with their secrets, the specs of a few functions
// outgrow that, and the worker would end every session at the first
// message. Each message stays under the limit, and a Create never goes
// before its function's spec.
func TestSessionSplitsLargeSpecBatches(t *testing.T) {
	big := make([]byte, spec.MaxSecretSize)
	data := map[string][]byte{}
	var names []string
	for i := range spec.MaxSecretsPerFunction {
		n := fmt.Sprintf("s%d", i)
		data[n], names = big, append(names, n)
	}
	const fns = 5
	s := newSession(1)
	for i := range fns {
		f := &spec.Function{Name: fmt.Sprintf("f%d", i), Revision: 1, Secrets: names}
		s.create(f, fmt.Sprintf("sb-%d", i), data, 1)
		s.tombstone(fmt.Sprintf("old-%d", i))
	}
	s.create(&spec.Function{Name: "plain", Revision: 1}, "sb-plain", nil, 0)
	specs, creates, tombs, msgs := map[string]bool{}, 0, 0, 0
	for cmds := s.take(); cmds != nil; cmds = s.take() {
		msgs++
		if n := proto.Size(&briskv1.ToWorker{Epoch: 1, Msg: &briskv1.ToWorker_Commands{Commands: cmds}}); n > 64<<20 {
			t.Fatalf("message %d: %d bytes, more than a worker takes", msgs, n)
		}
		for _, p := range cmds.Specs {
			specs[p.GetName()] = true
		}
		for _, cr := range cmds.Creates {
			if !specs[cr.GetFunction()] {
				t.Fatalf("message %d: a create of %s before its spec", msgs, cr.GetFunction())
			}
			creates++
		}
		tombs += len(cmds.Tombstones)
	}
	if len(specs) != fns+1 || creates != fns+1 || tombs != fns {
		t.Fatalf("%d messages carried %d specs, %d creates, %d tombstones; want %d, %d, %d", msgs, len(specs), creates, tombs, fns+1, fns+1, fns)
	}
}
