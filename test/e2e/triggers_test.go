package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brisk-faas/brisk/internal/trigger"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// triggerTicks returns the ticks (unix seconds) of the calls trigger uid
// made that succeeded, sorted (nil when the calls cannot be read).
func triggerTicks(t *testing.T, cl *client.Client, fn, uid string) []int64 {
	t.Helper()
	recs, err := cl.Calls(context.Background(), fn, "", 1000)
	if err != nil {
		return nil
	}
	var ticks []int64
	for _, r := range recs {
		rest, ok := strings.CutPrefix(r.ID, "trigger-"+uid+"-")
		if !ok || r.Status != api.CallSucceeded {
			continue
		}
		if r.Attempts != 1 { // in flight at a kill: run again (at least once)
			t.Logf("call %s: %d attempts", r.ID, r.Attempts)
		}
		n, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			t.Fatalf("call id %s: not a tick", r.ID)
		}
		ticks = append(ticks, n)
	}
	slices.Sort(ticks)
	return ticks
}

// Triggers on `brisk up` with a real function on the process runtime: a
// cron trigger fires every second, a NATS trigger calls the function for
// each message published to the embedded server, bad requests get clear
// errors, another tenant cannot reach the function, a deleted function
// takes its triggers along, and after kill -9 and a restart the missed
// ticks fire once (catch_up once) and no tick twice.
func TestTriggersOnBriskUp(t *testing.T) {
	c := newCluster(t)
	natsAddr := freePort(t)
	upArgs := []string{"--nats-listen", natsAddr}
	p := c.up(t, upArgs...)
	ctx := context.Background()
	c.mustBrisk(t, "fn", "deploy", "tick", "--builtin", "trace", "--public")
	out := c.mustBrisk(t, "trigger", "create", "every", "--function", "tick", "--cron", "@every 1s", "--payload", "{}", "--content-type", "application/json")
	if !strings.Contains(out, `calls tick on "@every 1s"`) {
		t.Errorf("create said %q", out)
	}
	every, err := c.cl.Trigger(ctx, "", "every")
	if err != nil || every.UID == "" || every.Namespace != "default" || every.Status.State != "active" {
		t.Fatalf("trigger get: %+v, %v", every, err)
	}
	eventually(t, 60*time.Second, "three ticks called", func() bool { return len(triggerTicks(t, c.cl, "tick", every.UID)) >= 3 })

	// Bad requests.
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"trigger", "create", "b1", "--function", "tick", "--cron", "61 * * * *"}, "above maximum (59)"},
		{[]string{"trigger", "create", "b2", "--function", "nope", "--cron", "@hourly"}, `function "nope" not found in namespace "default" (HTTP 404)`},
		{[]string{"trigger", "create", "b3", "--function", "tick", "--nats", "orders.>"}, "lies under its namespace"},
		{[]string{"trigger", "create", "b4", "--function", "tick", "--cron", "@hourly", "--tz", "Mars/Olympus"}, "not an IANA time zone"},
		{[]string{"trigger", "create", "b5", "--function", "tick", "--nats", "x.>", "--nats-url", "nats://u:p@10.0.0.1:4222"}, "credentials in a secret"},
		{[]string{"trigger", "create", "every", "--function", "tick", "--cron", "@hourly"}, "already exists"},
		{[]string{"trigger", "create", "b6", "--function", "tick"}, "give --cron EXPR or --nats SUBJECT"},
		{[]string{"trigger", "get", "nope"}, `trigger "nope" not found`},
	} {
		out, code := c.brisk(t, bad.args...)
		if code == 0 || !strings.Contains(out, bad.want) {
			t.Errorf("brisk %s: exit %d, %q; want an error saying %q", strings.Join(bad.args, " "), code, out, bad.want)
		}
	}

	// Another tenant: the same answer whether the function exists or not.
	if _, err := c.cl.PutNamespace(ctx, "team-a", spec.Quota{}); err != nil {
		t.Fatal(err)
	}
	tok, err := c.cl.CreateToken(ctx, api.TokenRequest{Name: "team-a", Scopes: []string{"deploy", "invoke"}, Namespace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	tenant := client.New(c.admin, c.invokeAddr)
	tenant.Token = tok.Token
	_, err = tenant.CreateTrigger(ctx, spec.Trigger{Name: "steal", Function: "tick", Cron: &spec.CronSource{Schedule: "@every 1s"}})
	var he *client.Error
	if !errors.As(err, &he) || he.Status != http.StatusNotFound || !strings.Contains(err.Error(), `"team-a"`) {
		t.Errorf("another tenant's function: %v, want 404 in its own namespace", err)
	}
	_, err = tenant.CreateTrigger(ctx, spec.Trigger{Name: "steal", Namespace: "default", Function: "tick", Cron: &spec.CronSource{Schedule: "@every 1s"}})
	if !errors.As(err, &he) || he.Status != http.StatusForbidden {
		t.Errorf("a trigger in another namespace: %v, want 403", err)
	}
	if ts, err := tenant.Triggers(ctx, "", ""); err != nil || len(ts) != 0 {
		t.Errorf("the tenant lists %d triggers (%v), want none of default's", len(ts), err)
	}

	// A function's triggers show in fn get and go with it.
	c.mustBrisk(t, "fn", "deploy", "gone", "--builtin", "trace", "--public")
	c.mustBrisk(t, "trigger", "create", "gone-hourly", "--function", "gone", "--cron", "@hourly")
	if trs := c.fn(t, "gone").Status.Triggers; len(trs) != 1 || trs[0].Name != "gone-hourly" || trs[0].Kind != "cron" {
		t.Errorf("fn get gone: triggers %+v", trs)
	}
	c.mustBrisk(t, "fn", "delete", "gone")
	if out, code := c.brisk(t, "trigger", "get", "gone-hourly"); code == 0 || !strings.Contains(out, "404") {
		t.Errorf("trigger of a deleted function: exit %d, %q", code, out)
	}

	// OpenFaaS connector annotations own triggers: made at deploy, changed
	// and dropped with them; a bad schedule is refused at deploy.
	ann := &spec.Function{Name: "conn", Builtin: "trace", Auth: spec.AuthPublic,
		Annotations: map[string]string{"topic": "cron-function,orders.paid", "schedule": "*/5 * * * *"}}
	if _, err := c.cl.Create(ctx, ann); err != nil {
		t.Fatal(err)
	}
	managed := func() map[string]*api.TriggerView {
		ts, err := c.cl.Triggers(ctx, "", "conn")
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]*api.TriggerView{}
		for i := range ts {
			m[ts[i].Name] = &ts[i]
		}
		return m
	}
	m := managed()
	if cr, nt := m["conn-cron"], m["conn-topic-orders-paid"]; len(m) != 2 || cr == nil || cr.Cron.Schedule != "*/5 * * * *" || cr.Managed != "annotations" ||
		nt == nil || nt.NATS.Subject != "default.orders.paid" {
		t.Errorf("annotation triggers: %+v", m)
	}
	ann.Annotations = map[string]string{"topic": "cron-function", "schedule": "0 * * * *"}
	if _, err := c.cl.Update(ctx, ann); err != nil {
		t.Fatal(err)
	}
	if m = managed(); len(m) != 1 || m["conn-cron"] == nil || m["conn-cron"].Cron.Schedule != "0 * * * *" {
		t.Errorf("after the update: %+v", m)
	}
	if _, err := c.cl.UpdateTrigger(ctx, spec.Trigger{Name: "conn-cron", Function: "conn", Cron: &spec.CronSource{Schedule: "@hourly"}}); !errors.As(err, &he) || he.Status != http.StatusConflict {
		t.Errorf("updating an annotation trigger: %v, want 409", err)
	}
	ann.Annotations["schedule"] = "every day"
	if _, err := c.cl.Update(ctx, ann); err == nil || !strings.Contains(err.Error(), "schedule") {
		t.Errorf("a bad schedule annotation: %v", err)
	}
	// Knative PingSource YAML.
	ps := filepath.Join(t.TempDir(), "ping.yaml")
	if err := os.WriteFile(ps, []byte(`apiVersion: sources.knative.dev/v1
kind: PingSource
metadata:
  name: ping
spec:
  schedule: "*/2 * * * *"
  data: '{"ms": 1}'
  sink:
    ref:
      apiVersion: serving.knative.dev/v1
      kind: Service
      name: conn
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := c.mustBrisk(t, "apply", "-f", ps); !strings.Contains(out, "pingsource.sources.knative.dev/ping created") {
		t.Errorf("apply: %q", out)
	}
	if out := c.mustBrisk(t, "apply", "-f", ps); !strings.Contains(out, "pingsource.sources.knative.dev/ping configured") {
		t.Errorf("apply again: %q", out)
	}
	if p := managed()["ping"]; p == nil || p.Headers["Ce-Type"] != "dev.knative.sources.ping" || p.Cron.ContentType != "application/json" {
		t.Errorf("the PingSource's trigger: %+v", p)
	}
	c.mustBrisk(t, "fn", "delete", "conn")
	if ts, _ := c.cl.Triggers(ctx, "", "conn"); len(ts) != 0 {
		t.Errorf("triggers of the deleted function: %+v", ts)
	}

	// NATS: messages published to the embedded server.
	c.mustBrisk(t, "trigger", "create", "orders", "--function", "tick", "--nats", "default.orders.>")
	orders, err := c.cl.Trigger(ctx, "", "orders")
	if err != nil {
		t.Fatal(err)
	}
	natsTok, err := os.ReadFile(filepath.Join(c.dataDir, "nats.token"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+natsAddr, nats.Token(strings.TrimSpace(string(natsTok))))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	orderCalls := func() int {
		recs, _ := c.cl.Calls(ctx, "tick", "", 1000)
		n := 0
		for _, r := range recs {
			if strings.HasPrefix(r.ID, "trigger-"+orders.UID+"-") && r.Status == api.CallSucceeded {
				n++
			}
		}
		return n
	}
	eventually(t, 30*time.Second, "the NATS trigger subscribed", func() bool {
		_ = nc.Publish("default.orders.probe", []byte("{}"))
		_ = nc.Flush()
		return orderCalls() > 0
	})
	base := orderCalls()
	for range 50 {
		if err := nc.Publish("default.orders.created", []byte(`{"ms":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	eventually(t, 60*time.Second, "50 messages called", func() bool { return orderCalls() >= base+50 })

	// Pause and resume (of the NATS trigger: the cron one's ticks are
	// checked below).
	if out := c.mustBrisk(t, "trigger", "pause", "orders"); !strings.Contains(out, "paused") {
		t.Errorf("pause said %q", out)
	}
	if out := c.mustBrisk(t, "trigger", "resume", "orders"); !strings.Contains(out, "active") {
		t.Errorf("resume said %q", out)
	}
	// Update in place: the same uid, the new schedule.
	c.mustBrisk(t, "trigger", "create", "upd", "--function", "tick", "--cron", "@hourly")
	upd, _ := c.cl.Trigger(ctx, "", "upd")
	if out := c.mustBrisk(t, "trigger", "update", "upd", "--function", "tick", "--cron", "0 3 * * *", "--tz", "Asia/Tokyo"); !strings.Contains(out, "updated") {
		t.Errorf("update said %q", out)
	}
	after, err := c.cl.Trigger(ctx, "", "upd")
	if err != nil || after.UID != upd.UID || after.Cron.Schedule != "0 3 * * *" || after.Cron.TimeZone != "Asia/Tokyo" || after.Status.Next.UTC().Hour() != 18 {
		t.Errorf("after the update: %+v (%v), want uid %s and the new schedule (next at 18:00 UTC)", after, err, upd.UID)
	}
	if out, code := c.brisk(t, "trigger", "update", "nope", "--function", "tick", "--cron", "@hourly"); code == 0 || !strings.Contains(out, "404") {
		t.Errorf("updating a missing trigger: exit %d, %q", code, out)
	}
	c.mustBrisk(t, "trigger", "delete", "upd")
	if out := c.mustBrisk(t, "trigger", "list"); !strings.Contains(out, "every") || !strings.Contains(out, "default.orders.>") {
		t.Errorf("trigger list:\n%s", out)
	}

	// kill -9 and a restart: the ticks missed meanwhile fire once.
	before := triggerTicks(t, c.cl, "tick", every.UID)
	p.stop(syscall.SIGKILL)
	killed := time.Now()
	// The outage must span several ticks: this wait is the fault, not a
	// synchronisation.
	time.Sleep(3 * time.Second)
	c.up(t, upArgs...)
	restarted := time.Now()
	var ticks []int64
	eventually(t, 60*time.Second, "ticks after the restart", func() bool {
		ticks = triggerTicks(t, c.cl, "tick", every.UID)
		return len(ticks) > 0 && ticks[len(ticks)-1] > restarted.Unix()+2
	})
	if len(ticks) < len(before) {
		t.Fatalf("%d ticks after the restart, %d before", len(ticks), len(before))
	}
	// One gap (the outage, its ticks collapsed into the one fired on
	// recovery), elsewhere a call every second.
	var gaps [][2]int64
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i] - ticks[i-1]; d == 0 {
			t.Errorf("tick %d called twice", ticks[i])
		} else if d > 1 {
			gaps = append(gaps, [2]int64{ticks[i-1], ticks[i]})
		}
	}
	if len(gaps) != 1 || gaps[0][0] > killed.Unix() || gaps[0][1] < killed.Unix()+2 || gaps[0][1] > restarted.Unix()+1 {
		t.Errorf("ticks %v: gaps %v, want one, from before the kill (%d) to the catch-up tick after the restart (%d)", ticks, gaps, killed.Unix(), restarted.Unix())
	}
}

// kill -9 of the control-plane leader while a cron trigger fires every
// second: the new leader goes on from the last recorded tick, the ticks
// missed during the election fire once (the latest), and no tick runs
// twice: the data planes ran as many calls as there are call records.
func TestTriggerSurvivesLeaderKill(t *testing.T) {
	h := newHACluster(t, haOptions{workers: 1, nats: true})
	ctx := context.Background()
	cl := h.client()
	name := h.tag + "cron"
	f := testTraceSpec(name, 1)
	f.Auth = spec.AuthPublic
	if _, err := cl.Create(ctx, f); err != nil {
		t.Fatal(err)
	}
	tr, err := cl.CreateTrigger(ctx, spec.Trigger{Name: "every", Function: name,
		Cron: &spec.CronSource{Schedule: "@every 1s", Payload: `{"ms":1}`, ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	ticks := func() []int64 { return triggerTicks(t, h.client(), name, tr.UID) }
	eventually(t, 60*time.Second, "three ticks called", func() bool { return len(ticks()) >= 3 })
	old := h.leader()
	old.p.stop(syscall.SIGKILL)
	killed := time.Now()
	eventually(t, 30*time.Second, "a new leader", func() bool { l := h.leader(); return l != nil && l != old })
	elected := time.Now()
	h.startReplica(old)
	var got []int64
	eventually(t, 60*time.Second, "ticks under the new leader", func() bool {
		got = ticks()
		return len(got) > 0 && got[len(got)-1] > elected.Unix()+3
	})
	t.Logf("ticks %v (kill at %d, new leader at %d)", got, killed.Unix(), elected.Unix())
	for i := 1; i < len(got); i++ {
		if d := got[i] - got[i-1]; d == 0 {
			t.Errorf("tick %d called twice", got[i])
		} else if d > 1 && (got[i-1] > killed.Unix() || got[i] > elected.Unix()+2) {
			t.Errorf("ticks %v: a gap from %d to %d, not the election's (kill %d, elected %d)", got, got[i-1], got[i], killed.Unix(), elected.Unix())
		}
	}
	// Executions: every call record ran once (no data plane was killed).
	eventually(t, 30*time.Second, "the data planes' deliveries match the calls", func() bool {
		runs := 0.0
		for _, d := range h.dps {
			v, _ := metricSample(t, "http://"+d.addr+"/metrics", `brisk_async_delivered_total{function="`+name+`",outcome="succeeded"}`)
			runs += v
		}
		recs, err := h.client().Calls(ctx, name, "", 1000)
		return err == nil && runs == float64(len(recs))
	})
}

// A cron trigger's function at zero is pre-warmed before each tick: the
// first tick's call finds a warm sandbox, where without the forecast it
// would have been the cold start that scales the function up.
func TestCronTriggerPrewarms(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	ctx := context.Background()
	c.mustBrisk(t, "fn", "deploy", "timer", "--builtin", "trace", "--public")
	tr, err := c.cl.CreateTrigger(ctx, spec.Trigger{Name: "t", Function: "timer",
		Cron: &spec.CronSource{Schedule: "@every 10s", Payload: `{"ms":1}`, ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	if st := c.fn(t, "timer").Status; st.Desired != 0 || st.Ready != 0 {
		t.Fatalf("right after the trigger's creation, 10 s before its tick: %+v, want nothing started yet", st)
	}
	var rec *client.CallRecord
	eventually(t, 60*time.Second, "the first tick's call", func() bool {
		recs, err := c.cl.Calls(ctx, "timer", "", 10)
		if err != nil {
			return false
		}
		for i := range recs {
			if strings.HasPrefix(recs[i].ID, "trigger-"+tr.UID+"-") && recs[i].Status == api.CallSucceeded {
				rec = &recs[i]
			}
		}
		return rec != nil
	})
	timing := rec.Result.Header.Get("X-Brisk-Timing")
	if !strings.Contains(timing, "cold=false") {
		t.Errorf("the first tick's call: X-Brisk-Timing %q, want a warm start (pre-warmed)", timing)
	}
}

// A JetStream trigger's messages are each called at least once across a
// kill -9 of one of two data planes while they run: the killed one's calls
// go to the other once their ack wait passes.
func TestNATSTriggerSurvivesDataPlaneKill(t *testing.T) {
	h := newHACluster(t, haOptions{workers: 1, nats: true})
	ctx := context.Background()
	cl := h.client()
	name := h.tag + "orders"
	f := testTraceSpec(name, 1)
	f.Auth, f.Concurrency = spec.AuthPublic, 8
	if _, err := cl.Create(ctx, f); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(h.natsURL, nats.Token(h.natsToken))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"default.orders.>"}}); err != nil {
		t.Fatal(err)
	}
	tr, err := cl.CreateTrigger(ctx, spec.Trigger{Name: "orders", Function: name, NATS: &spec.NATSSource{Subject: "default.orders.>", Stream: "ORDERS"}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the trigger's durable consumer", func() bool {
		_, err := js.Consumer(ctx, "ORDERS", "brisk-"+tr.UID)
		return err == nil
	})
	const n = 120
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, "default.orders.new", []byte(`{"ms": 300}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, n/2)
	eventually(t, 30*time.Second, "calls running", func() bool {
		r, err := h.client().Call(ctx, trigger.MessageCallID(tr.UID, 1))
		return err == nil && r.Status != api.CallQueued
	})
	h.dps[0].p.stop(syscall.SIGKILL)
	publish(n/2, n)
	missing := func() (out []uint64) {
		for seq := uint64(1); seq <= n; seq++ {
			r, err := h.client().Call(ctx, trigger.MessageCallID(tr.UID, seq))
			if err != nil || r.Status != api.CallSucceeded {
				out = append(out, seq)
			}
		}
		return out
	}
	eventually(t, 90*time.Second, "every message called", func() bool {
		left := missing()
		if len(left) > 0 && len(left) < 5 {
			t.Logf("messages not called yet: %v", left)
		}
		return len(left) == 0
	})
	st, err := h.client().Trigger(ctx, "", "orders")
	if err != nil || st.Status.Fired < n {
		t.Errorf("trigger status %+v (%v), want %d fired", st.Status, err, n)
	}
}
