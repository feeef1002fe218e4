package specpb

import (
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

func TestRoundTrip(t *testing.T) {
	f := &spec.Function{Name: "f", Builtin: "trace", Revision: 7, Env: map[string]string{"K": "V"}, LoadBalancing: "knative",
		Command: []string{"a", "b"}, Secrets: []string{"s"}, SecretData: map[string][]byte{"s": []byte("v")}, Namespace: "team",
		Async: spec.Async{MaxAttempts: 5}}
	f.ApplyDefaults()
	f.Timeout = spec.Duration(3 * time.Second)
	g := FromProto(ToProto(f))
	if g.Name != f.Name || g.Revision != 7 || g.Env["K"] != "V" || g.Concurrency != f.Concurrency || len(g.Command) != 2 ||
		g.Queue != f.Queue || g.Timeout != f.Timeout || g.Resources != f.Resources || g.LoadBalancing != "knative" || g.Port != f.Port ||
		g.Namespace != "team" || string(g.SecretData["s"]) != "v" || g.Async.MaxAttempts != 5 {
		t.Fatalf("round trip lost data:\n%+v\n%+v", f, g)
	}
}

// On the wire each traffic target names the function serving it.
func TestTrafficOnTheWire(t *testing.T) {
	g := &spec.Function{Name: "web", Revision: 9, Traffic: []spec.TrafficTarget{{Revision: 9, Percent: 50}, {Revision: 4, Percent: 50}}}
	p := ToProto(g).GetTraffic()
	if len(p) != 2 || p[0].GetFunction() != "web" || p[1].GetFunction() != "web_r4" || p[1].GetPercent() != 50 {
		t.Fatalf("wire traffic: %v", p)
	}
	if back := FromProto(ToProto(g)); len(back.Traffic) != 2 || back.Traffic[1] != (spec.TrafficTarget{Revision: 4, Percent: 50}) {
		t.Fatalf("FromProto traffic: %+v", back.Traffic)
	}
}
