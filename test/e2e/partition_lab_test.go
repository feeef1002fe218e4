package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
	"github.com/brisk-faas/brisk/test/lab"
)

// labCluster is brisk on lab hosts (test/lab), each component on a host of
// its own so that faults can cut them apart (docs/reliability.md,
// "Partitions"): 3 or 5 control-plane replicas, 2 data planes behind a
// gateway, a NATS server for asynchronous calls, and 3 workers: two on the
// process runtime, whose sandboxes listen on their host's address, and one
// on the native runtime, whose sandboxes' subnet the data planes' hosts
// route to it (--net-ingress).
type labCluster struct {
	t       *testing.T
	lab     *lab.Lab
	cps     []*labReplica
	dps     []*lab.Proc
	gw      *lab.Host
	workers []*lab.Proc
	dirs    []string
	// natPrefix names the native worker's sandbox namespaces.
	natPrefix string
}

type labReplica struct {
	host *lab.Host
	dir  string
	proc *lab.Proc
}

// Ports every host uses for its component (each host has its own address).
const (
	labRaft, labAdmin, labGRPC, labInvoke, labWorker, labNATS = 7100, 9090, 9091, 8080, 9200, 4222
)

func newLabCluster(t *testing.T, replicas int) *labCluster {
	if why := lab.Available(); why != "" {
		t.Skip("partition lab: " + why)
	}
	l := lab.New(t)
	c := &labCluster{t: t, lab: l}
	var peers, grpcs []string
	for i := range replicas {
		h := l.Host(fmt.Sprintf("cp%d", i+1))
		r := &labReplica{host: h, dir: l.TempDir()}
		c.cps = append(c.cps, r)
		c.dirs = append(c.dirs, r.dir)
		peers = append(peers, fmt.Sprintf("%s=%s|%s|%s", h.Name, h.Addr(labRaft), h.Addr(labAdmin), h.Addr(labGRPC)))
		grpcs = append(grpcs, h.Addr(labGRPC))
	}
	for _, r := range c.cps {
		registerAdmin(r.host.Addr(labAdmin), c.dirs...)
	}
	// One cluster CA for the replicas, made before their first start.
	if out, err := exec.Command(briskBin, "ca", "init", "--data-dir", c.cps[0].dir).CombinedOutput(); err != nil {
		t.Fatalf("brisk ca init: %v: %s", err, out)
	}
	for _, r := range c.cps[1:] {
		for _, f := range []string{pki.CACertFile, pki.CAKeyFile} {
			b, err := os.ReadFile(filepath.Join(c.cps[0].dir, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(r.dir, f), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, r := range c.cps {
		r.proc = r.host.Start(briskBin, "controlplane", "--id", r.host.Name, "--peers", strings.Join(peers, ","), "--data-dir", r.dir,
			"--autoscale-interval", "200ms", "--drain-delay", "100ms", "--startup-grace", "3s", "--node-grace", "2s")
	}
	nats := l.Host("nats")
	natsToken := filepath.Join(l.TempDir(), "nats.token")
	if err := os.WriteFile(natsToken, []byte("lab-nats-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nats.Start(briskBin, "nats", "--listen", nats.Addr(labNATS), "--token-file", natsToken, "--data-dir", l.TempDir())
	join := joinArgs(t, c.dirs...)
	cpGRPC := strings.Join(grpcs, ",")
	var dpAddrs []string
	for i := range 2 {
		h := l.Host(fmt.Sprintf("dp%d", i+1))
		c.dps = append(c.dps, h.Start(briskBin, append([]string{"dataplane", "--id", h.Name, "--invoke", h.Addr(labInvoke), "--controlplane", cpGRPC,
			"--state-dir", l.TempDir(), "--nats", "nats://" + nats.Addr(labNATS), "--nats-token-file", natsToken, "--async-ack-wait", "2s"}, join...)...))
		dpAddrs = append(dpAddrs, h.Addr(labInvoke))
		registerAdmin(h.Addr(labInvoke), c.dirs...)
	}
	for i := range 3 {
		h := l.Host(fmt.Sprintf("w%d", i+1))
		args := []string{"worker", "--node-id", h.Name, "--controlplane", cpGRPC, "--listen", h.Addr(labWorker),
			"--cpu", "4", "--state-dir", l.TempDir(), "--stop-on-exit"}
		if i < 2 {
			args = append(args, "--runtime", "process", "--sandbox-host", h.IP)
		} else {
			// A subnet, bridge and name prefix of its own (they are
			// claimed host-wide), routed to it from the data planes' hosts.
			c.natPrefix = l.Claim("lw")
			subnet := fmt.Sprintf("10.251.%d.0/24", l.Block())
			var ingress []string
			for _, dp := range c.dps {
				dp.Host.Route(subnet, h)
				ingress = append(ingress, dp.Host.IP+"/32")
			}
			args = append(args, "--runtime", "native", "--net-subnet", subnet, "--net-prefix", c.natPrefix, "--net-bridge", c.natPrefix+"br",
				"--net-ingress", strings.Join(ingress, ","), "--net-dns=false", "--net-egress=false")
		}
		c.workers = append(c.workers, h.Start(briskBin, append(args, join...)...))
	}
	c.gw = l.Host("gw")
	c.gw.Start(briskBin, "gateway", "--listen", c.gw.Addr(labInvoke), "--dataplanes", strings.Join(dpAddrs, ","))
	registerAdmin(c.gw.Addr(labInvoke), c.dirs...)
	eventually(t, 60*time.Second, "lab cluster up: a leader, 3 workers, 2 data planes and the gateway", func() bool {
		st, err := c.client(0, 2*time.Second).Status(context.Background())
		if err != nil {
			return false
		}
		nodes, dps := connectedCount(st)
		return nodes == 3 && dps == 2 && httpOK("http://"+c.gw.Addr(labInvoke)+"/healthz")
	})
	return c
}

// client talks to replica i's admin API only (followers proxy to the
// leader), and invokes through the gateway.
func (c *labCluster) client(i int, timeout time.Duration) *client.Client {
	cl := client.New(c.cps[i].host.Addr(labAdmin), c.gw.Addr(labInvoke))
	cl.HTTP = &http.Client{Timeout: timeout}
	return cl
}

// failoverClient is given every replica, replica first first, as a user
// of an HA control plane gives the CLI or the SDK: it moves to another
// replica when its own cannot serve (pkg/client's failover).
func (c *labCluster) failoverClient(first int, timeout time.Duration) *client.Client {
	var admins []string
	for i := range c.cps {
		admins = append(admins, c.cps[(first+i)%len(c.cps)].host.Addr(labAdmin))
	}
	cl := client.New(strings.Join(admins, ","), c.gw.Addr(labInvoke))
	cl.HTTP = &http.Client{Timeout: timeout}
	return cl
}

// leader is the replica that says it leads, or nil.
func (c *labCluster) leader() *labReplica {
	for _, r := range c.cps {
		if v, ok := replicaView(r.host.Addr(labAdmin)); ok && v.Role == "leader" {
			return r
		}
	}
	return nil
}

func (c *labCluster) cpHosts(except ...*labReplica) []*lab.Host {
	var hs []*lab.Host
	for _, r := range c.cps {
		if !slices.Contains(except, r) {
			hs = append(hs, r.host)
		}
	}
	return hs
}

func (c *labCluster) dpHosts() []*lab.Host {
	var hs []*lab.Host
	for _, p := range c.dps {
		hs = append(hs, p.Host)
	}
	return hs
}

// The workload's functions: registers (a function's label "v", never
// called), secrets (their size is the register), "warm" (3 sandboxes, one
// per worker, called synchronously) and "bg" (called asynchronously).
var (
	labRegisters = []string{"reg-a", "reg-b", "reg-c", "reg-d", "reg-e", "reg-f"}
	labSecrets   = []string{"sec-a", "sec-b"}
)

func regFunction(name, v string) *spec.Function {
	return &spec.Function{Name: name, Builtin: "trace", Labels: map[string]string{"v": v}, Resources: spec.Resources{MilliCPU: 50, MemoryMB: 32}}
}

// setUp registers the workload's functions and secrets and waits for
// warm's two sandboxes.
func (c *labCluster) setUp() {
	t := c.t
	cl := c.failoverClient(0, 10*time.Second)
	ctx := context.Background()
	for _, k := range append(slices.Clone(labRegisters), "reg-probe") {
		if _, err := cl.Create(ctx, regFunction(k, "0")); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range labSecrets {
		if _, err := cl.CreateSecret(ctx, api.SecretRequest{Name: k, Value: "0"}); err != nil {
			t.Fatal(err)
		}
	}
	warm := &spec.Function{Name: "warm", Builtin: "trace", Concurrency: 8, Scaling: spec.Scaling{Min: 3, Max: 3},
		Resources: spec.Resources{MilliCPU: 50, MemoryMB: 32}, Placement: "round-robin"}
	bg := &spec.Function{Name: "bg", Builtin: "trace", Concurrency: 8, Scaling: spec.Scaling{Min: 1, Max: 2},
		Resources: spec.Resources{MilliCPU: 50, MemoryMB: 32}}
	// dud always fails (the watchdog running false): its async calls are
	// dead-lettered after their second attempt.
	dud := &spec.Function{Name: "dud", Builtin: "watchdog", Env: map[string]string{"fprocess": "false"}, Concurrency: 8,
		Scaling: spec.Scaling{Min: 1, Max: 1}, Resources: spec.Resources{MilliCPU: 50, MemoryMB: 32},
		Async: spec.Async{MaxAttempts: 2, RetryFunctionErrors: true, Backoff: spec.Duration(100 * time.Millisecond)}}
	for _, f := range []*spec.Function{warm, bg, dud, scaled(1)} {
		if _, err := cl.Create(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "warm's three sandboxes ready, one per worker, and bg's one", func() bool {
		v, err := cl.Get(ctx, "warm")
		b, err2 := cl.Get(ctx, "bg")
		if err != nil || err2 != nil || v.Status.Ready != 3 || b.Status.Ready < 1 {
			return false
		}
		nodes := map[string]bool{}
		for _, sb := range v.Status.Sandboxes {
			nodes[sb.Node] = true
		}
		return len(nodes) == 3
	})
}

// scaled is the function "sc", its min scaled between 0 and 2 by the
// workload (its max is 2).
func scaled(min int) *spec.Function {
	return &spec.Function{Name: "sc", Builtin: "trace", Scaling: spec.Scaling{Min: min, Max: 2}, Resources: spec.Resources{MilliCPU: 50, MemoryMB: 32}}
}

// workload is the mixed work clients run through a schedule: registers
// and secrets written and read through the replicas (checked for
// linearizability), tokens made and revoked, warm calls through the
// gateway and asynchronous calls, each counted before, during and after
// the fault (phase).
type workload struct {
	c     *labCluster
	h     *lab.History
	phase atomic.Int32 // 0 before, 1 during, 2 after the fault
	stop  context.CancelFunc
	wg    sync.WaitGroup

	callsOK, callsFailed [3]atomic.Int64
	lastCallErr          atomic.Value

	mu      sync.Mutex
	async   []string // acknowledged asynchronous call ids of bg
	duds    []string // and of dud
	asyncNo int      // submits refused or of unknown outcome
	tokens  map[string]labToken
	tokenNo int
	// maxWarm and maxScaled are the most sandboxes of the current revision
	// (not terminating) the table gave warm and sc at once, as read through
	// the replicas: never above their max. (A change of scale is a new
	// revision, as in Knative; the old revision's sandboxes roll over once
	// the new one's serve, so the bound holds per revision.)
	maxWarm, maxScaled atomic.Int64
	// created are the functions whose registration was acknowledged;
	// createdNo counts those refused or of unknown outcome.
	created   []string
	createdNo int
	// okAt are the times (since the history's start) at which the
	// failover clients' operations succeeded: their longest gap during the
	// fault is the control plane's unavailability as such a client sees it.
	okAt []time.Duration
}

type labToken struct {
	id, secret string
	revoked    bool   // its revocation was acknowledged
	revokeErr  string // its revocation failed: it may or may not have taken effect
}

// start runs the workload until stopped: 4 register clients (two on one
// replica each, two with failover), 4 warm callers, an async submitter and
// a token client.
func (c *labCluster) start() *workload {
	w := &workload{c: c, h: lab.NewHistory(), tokens: map[string]labToken{}}
	for _, k := range labRegisters {
		w.h.Write(0, k, "0", 0, true) // made before the history: its first value
	}
	for _, k := range labSecrets {
		w.h.Write(0, "secret/"+k, "1", 0, true) // "0": one byte
	}
	ctx, stop := context.WithCancel(context.Background())
	w.stop = stop
	var seq atomic.Int64
	for id := range 4 {
		w.wg.Go(func() { w.registers(ctx, id, &seq) })
	}
	for range 4 {
		w.wg.Go(func() { w.calls(ctx) })
	}
	w.wg.Go(func() { w.submits(ctx) })
	w.wg.Go(func() { w.watchWarm(ctx) })
	w.wg.Go(func() { w.registrations(ctx) })
	w.wg.Go(func() { w.scale(ctx) })
	w.wg.Go(func() { w.tokenChurn(ctx) })
	return w
}

func (w *workload) end() {
	w.stop()
	w.wg.Wait()
}

func (w *workload) succeeded(at int64) {
	w.mu.Lock()
	w.okAt = append(w.okAt, time.Duration(at))
	w.mu.Unlock()
}

// registers writes and reads the registers and the secrets' sizes. Clients
// 0 and 1 send each operation to one replica picked at random; 2 and 3
// are failover clients. Odd clients wait long: their calls to a paused
// replica are answered after it resumes.
func (w *workload) registers(ctx context.Context, id int, seq *atomic.Int64) {
	rng := rand.New(rand.NewPCG(uint64(id), 7))
	timeout := time.Second
	if id%2 == 1 {
		timeout = 15 * time.Second
	}
	failover := id >= 2
	fc := w.c.failoverClient(rng.IntN(len(w.c.cps)), timeout)
	keys := append(slices.Clone(labRegisters), labSecrets...)
	for ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // paced: ~100 operations/s per client at most
		cl := fc
		if !failover {
			cl = w.c.client(rng.IntN(len(w.c.cps)), timeout)
		}
		key := keys[rng.IntN(len(keys))]
		secret := slices.Contains(labSecrets, key)
		call := w.h.Now()
		var ok bool
		if rng.IntN(2) == 0 {
			n := seq.Add(1) + 1 // never "0"'s one byte
			var err error
			reg := key
			if secret {
				reg = "secret/" + key
				_, err = cl.UpdateSecret(context.Background(), api.SecretRequest{Name: key, Value: strings.Repeat("x", int(n))})
			} else {
				_, err = cl.Update(context.Background(), regFunction(key, strconv.FormatInt(n, 10)))
			}
			// A write the client knows was not applied is no operation;
			// any other error leaves it open to the end.
			if err != nil && client.NotApplied(err) {
				w.h.Refuse()
			} else {
				w.h.Write(id, reg, strconv.FormatInt(n, 10), call, err == nil)
			}
			ok = err == nil
		} else if secret {
			val, err := secretSize(cl, key)
			w.h.Read(id, "secret/"+key, call, val, err == nil)
			ok = err == nil
		} else {
			v, err := cl.Get(context.Background(), key)
			val := ""
			if err == nil {
				val = v.Function.Labels["v"]
			}
			w.h.Read(id, key, call, val, err == nil)
			ok = err == nil
		}
		if ok && failover {
			w.succeeded(w.h.Now())
		}
	}
}

// secretSize reads a secret's size (its register's value).
func secretSize(cl *client.Client, name string) (string, error) {
	list, err := cl.Secrets(context.Background(), "")
	if err != nil {
		return "", err
	}
	for _, s := range list {
		if s.Name == name {
			return strconv.Itoa(s.Size), nil
		}
	}
	return "", nil
}

// watchWarm reads warm's and sc's sandboxes from the table five times a
// second.
func (w *workload) watchWarm(ctx context.Context) {
	cl := w.c.failoverClient(2, time.Second)
	for ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		for fn, most := range map[string]*atomic.Int64{"warm": &w.maxWarm, "sc": &w.maxScaled} {
			if v, err := cl.Get(context.Background(), fn); err == nil {
				var n int64
				for _, sb := range v.Status.Sandboxes {
					if sb.Revision == v.Function.Revision && sb.State != "tombstoned" {
						n++
					}
				}
				raise(most, n)
			}
		}
	}
}

// raise sets a to n when n is more.
func raise(a *atomic.Int64, n int64) {
	for m := a.Load(); n > m; m = a.Load() {
		if a.CompareAndSwap(m, n) {
			return
		}
	}
}

// registrations registers a new function three times a second with a
// failover client.
func (w *workload) registrations(ctx context.Context) {
	cl := w.c.failoverClient(0, 2*time.Second)
	for n := 0; ctx.Err() == nil; n++ {
		time.Sleep(300 * time.Millisecond)
		name := fmt.Sprintf("new-%d", n)
		_, err := cl.Create(context.Background(), regFunction(name, "0"))
		w.mu.Lock()
		if err == nil {
			w.created = append(w.created, name)
		} else {
			w.createdNo++
		}
		w.mu.Unlock()
	}
}

// scale sets sc's min to 2 and back to 0, a change a second, until the
// fault heals (so that the cluster can settle after it).
func (w *workload) scale(ctx context.Context) {
	cl := w.c.failoverClient(1, 2*time.Second)
	for n := 0; ctx.Err() == nil && w.phase.Load() < 2; n++ {
		time.Sleep(time.Second)
		_, _ = cl.Update(context.Background(), scaled(2*(n%2)))
	}
}

// calls calls warm through the gateway.
func (w *workload) calls(ctx context.Context) {
	hc := &http.Client{Timeout: 5 * time.Second}
	url := "http://" + w.c.gw.Addr(labInvoke) + "/function/warm"
	for ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		p := w.phase.Load()
		resp, err := hc.Post(url, "application/json", strings.NewReader(`{"ms":1}`))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("HTTP %d (%s)", resp.StatusCode, resp.Header.Get("X-Brisk-Error"))
			}
		}
		if err != nil {
			w.callsFailed[p].Add(1)
			w.lastCallErr.Store(fmt.Sprintf("phase %d: %v", p, err))
		} else {
			w.callsOK[p].Add(1)
		}
	}
}

// submits submits asynchronous calls through the gateway, 20 a second:
// every fifth one to dud.
func (w *workload) submits(ctx context.Context) {
	cl := w.c.client(0, 5*time.Second)
	for n := 0; ctx.Err() == nil; n++ {
		time.Sleep(50 * time.Millisecond)
		fn := "bg"
		if n%5 == 4 {
			fn = "dud"
		}
		id, err := cl.InvokeAsync(context.Background(), fn, http.MethodPost, []byte(`{"ms":1}`), nil, "")
		w.mu.Lock()
		switch {
		case err != nil:
			w.asyncNo++
		case fn == "dud":
			w.duds = append(w.duds, id)
		default:
			w.async = append(w.async, id)
		}
		w.mu.Unlock()
	}
}

// tokenChurn makes a token five times a second with a failover client and
// revokes every other one it made.
func (w *workload) tokenChurn(ctx context.Context) {
	cl := w.c.failoverClient(1, 2*time.Second)
	for n := 0; ctx.Err() == nil; n++ {
		time.Sleep(200 * time.Millisecond)
		tv, err := cl.CreateToken(context.Background(), api.TokenRequest{Name: fmt.Sprintf("churn-%d", n), Scopes: []string{"invoke"}})
		if err != nil {
			w.mu.Lock()
			w.tokenNo++
			w.mu.Unlock()
			continue
		}
		tok := labToken{id: tv.ID, secret: tv.Token}
		if n%2 == 1 {
			if err := cl.RevokeToken(context.Background(), tv.ID); err != nil {
				tok.revokeErr = err.Error()
			} else {
				tok.revoked = true
			}
		}
		w.mu.Lock()
		w.tokens[tv.ID] = tok
		w.mu.Unlock()
	}
}

// maxGap is the longest stretch within [from, to] in which no failover
// client's operation succeeded.
func (w *workload) maxGap(from, to time.Duration) time.Duration {
	w.mu.Lock()
	at := slices.Clone(w.okAt)
	w.mu.Unlock()
	slices.Sort(at)
	gap, last := time.Duration(0), from
	for _, t := range at {
		if t < from {
			continue
		}
		if t > to {
			t = to
		}
		gap = max(gap, t-last)
		last = t
		if t == to {
			break
		}
	}
	return max(gap, to-last)
}

// check verifies, after the fault healed and the workload ended, what the
// acknowledged operations promise: the registry's and the secrets'
// history linearizable with nothing acknowledged lost (final reads
// through every replica); every acknowledged async call run to success
// (none dead); every acknowledged token working and every acknowledged
// revocation holding, at both data planes. It returns a summary.
func (w *workload) check(t *testing.T) string {
	c := w.c
	for i := range c.cps {
		cl := c.client(i, 10*time.Second)
		for _, k := range labRegisters {
			call := w.h.Now()
			v, err := cl.Get(context.Background(), k)
			val := ""
			if err == nil {
				val = v.Function.Labels["v"]
			}
			w.h.Read(100+i, k, call, val, err == nil)
			if err != nil {
				t.Errorf("final read of %s through %s: %v", k, c.cps[i].host.Name, err)
			}
		}
		for _, k := range labSecrets {
			call := w.h.Now()
			val, err := secretSize(cl, k)
			w.h.Read(100+i, "secret/"+k, call, val, err == nil)
			if err != nil {
				t.Errorf("final read of secret %s through %s: %v", k, c.cps[i].host.Name, err)
			}
		}
	}
	ok, why := w.h.Check(30 * time.Second)
	if !ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("brisk-history-%s-%d.jsonl", t.Name(), time.Now().Unix()))
		t.Errorf("the registry's history is not linearizable: %s (history in %s: %v)", why, path, w.h.Dump(path))
	}
	if w.h.Acked == 0 || w.h.Reads == 0 {
		t.Errorf("no register operation acknowledged (%d writes, %d reads): the workload did not run", w.h.Acked, w.h.Reads)
	}

	// Every acknowledged async call runs, at least once, and succeeds;
	// every call of dud is dead after exactly its 2 attempts (never run
	// after it was dead-lettered).
	w.mu.Lock()
	ids, duds, refused := slices.Clone(w.async), slices.Clone(w.duds), w.asyncNo
	tokens, tokensNo := w.tokens, w.tokenNo
	w.mu.Unlock()
	cl := c.client(0, 5*time.Second)
	redelivered, dead := 0, 0
	awaitFinished(t, cl, ids, "every acknowledged async call finished", func(id string, rec *client.CallRecord) {
		switch {
		case rec.Status != api.CallSucceeded:
			dead++
			t.Errorf("async call %s: %s after %d attempts (%s)", id, rec.Status, rec.Attempts, rec.Error)
		case rec.Attempts > 1:
			redelivered++
		}
	})
	if len(ids) == 0 || len(duds) == 0 {
		t.Errorf("%d async calls and %d dead-letter calls acknowledged: the workload did not run", len(ids), len(duds))
	}
	awaitFinished(t, cl, duds, "every acknowledged call of dud dead-lettered", func(id string, rec *client.CallRecord) {
		if rec.Status != api.CallDead || rec.Attempts != 2 {
			t.Errorf("call %s of dud: %s after %d attempts; want dead after 2", id, rec.Status, rec.Attempts)
		}
	})

	// Tokens: made ones work and revoked ones do not, at every data plane
	// (each learns the table from its control-plane session). A token
	// whose revocation failed may or may not be revoked (a write cut by a
	// leadership change can still commit): the registry decides, and every
	// data plane must agree with it.
	listed := map[string]bool{}
	views, err := c.failoverClient(0, 5*time.Second).Tokens(context.Background())
	if err != nil {
		t.Fatalf("the registry's tokens: %v", err)
	}
	for _, v := range views {
		listed[v.ID] = true
	}
	var live, revoked []labToken
	unsure := 0
	for _, tok := range tokens {
		if tok.revokeErr != "" {
			unsure++
		}
		switch {
		case tok.revoked || tok.revokeErr != "" && !listed[tok.id]:
			revoked = append(revoked, tok)
		default:
			live = append(live, tok)
		}
		if !tok.revoked && tok.revokeErr == "" && !listed[tok.id] {
			t.Errorf("token %s: made and never revoked, but the registry does not list it", tok.id)
		}
		if tok.revoked && listed[tok.id] {
			t.Errorf("token %s: its revocation was acknowledged, but the registry lists it", tok.id)
		}
	}
	t.Logf("tokens: %d live, %d revoked; %d failed revocations, decided by the registry", len(live), len(revoked), unsure)
	var lastMiss string // what the last check of a data plane met, said if it times out
	defer func() {
		if t.Failed() && lastMiss != "" {
			t.Logf("the last tokens check: %s", lastMiss)
		}
	}()
	for _, dp := range c.dps {
		url := "http://" + dp.Host.Addr(labInvoke) + "/function/warm"
		eventually(t, 30*time.Second, "tokens as acknowledged at "+dp.Host.Name, func() bool {
			for i, tok := range live {
				if code := callWithToken(url, tok.secret); code != http.StatusOK {
					lastMiss = fmt.Sprintf("%s: live token %d of %d (%s; revocation error %q): a call answered %d (0: no answer in 5 s)", dp.Host.Name, i+1, len(live), tok.id, tok.revokeErr, code)
					return false
				}
			}
			for i, tok := range revoked {
				if code := callWithToken(url, tok.secret); code != http.StatusUnauthorized {
					lastMiss = fmt.Sprintf("%s: revoked token %d of %d (%s; revocation error %q): a call answered %d", dp.Host.Name, i+1, len(revoked), tok.id, tok.revokeErr, code)
					return false
				}
			}
			return true
		})
	}
	if len(tokens) == 0 {
		t.Error("no token acknowledged: the workload did not run")
	}
	if n := w.maxWarm.Load(); n > 3 || n == 0 {
		t.Errorf("warm had up to %d sandboxes in the table at once; want its max of 3 (and a reading)", n)
	}
	if n := w.maxScaled.Load(); n > 2 || n == 0 {
		t.Errorf("sc had up to %d sandboxes in the table at once; want at most its max of 2 (and a reading)", n)
	}
	// Every acknowledged registration is there, through every replica.
	w.mu.Lock()
	created, createdNo := slices.Clone(w.created), w.createdNo
	w.mu.Unlock()
	for i := range c.cps {
		cl := c.client(i, 10*time.Second)
		list, err := cl.List(context.Background())
		if err != nil {
			t.Errorf("listing functions through %s: %v", c.cps[i].host.Name, err)
			continue
		}
		have := map[string]bool{}
		for _, f := range list {
			have[f.Name] = true
		}
		for _, name := range created {
			if !have[name] {
				t.Errorf("the acknowledged registration of %s is lost (listed through %s)", name, c.cps[i].host.Name)
			}
		}
	}
	if len(created) == 0 {
		t.Error("no registration acknowledged: the workload did not run")
	}
	return fmt.Sprintf("warm at most %d sandboxes in the table, sc %d; %d registrations acknowledged (%d not), 0 lost; registers %d writes acknowledged (%d unknown, %d refused), %d reads (%d failed), linearizable %v %s; async %d acknowledged (%d not), %d run more than once, %d lost or dead, %d dead-lettered after 2 attempts; tokens %d made (%d revoked, %d refused), 0 lost",
		w.maxWarm.Load(), w.maxScaled.Load(), len(created), createdNo, w.h.Acked, w.h.Unknown, w.h.Refused, w.h.Reads, w.h.FailedReads, ok, why, len(ids), refused, redelivered, dead, len(duds), len(tokens), len(revoked), tokensNo)
}

// awaitFinished polls the calls ids until every one has finished, handing
// each finished record to judge once.
func awaitFinished(t *testing.T, cl *client.Client, ids []string, what string, judge func(id string, rec *client.CallRecord)) {
	pending := slices.Clone(ids)
	eventually(t, 60*time.Second, what, func() bool {
		var left []string
		for _, id := range pending {
			rec, err := cl.Call(context.Background(), id)
			if err != nil || !rec.Status.Final() {
				left = append(left, id)
				continue
			}
			judge(id, rec)
		}
		pending = left
		return len(pending) == 0
	})
}

func callWithToken(url, token string) int {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"ms":1}`))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// converged reports whether the cluster is whole again: every worker and
// data plane connected; warm at its 3 ready sandboxes and nothing pending
// or terminating; each data plane routing to exactly those; and the
// sandbox processes on the workers' hosts exactly the table's sandboxes
// (none leaked, duplicated or revived).
func (c *labCluster) converged() (bool, string) {
	cl := c.failoverClient(0, 2*time.Second)
	st, err := cl.Status(context.Background())
	if err != nil {
		return false, err.Error()
	}
	nodes, dps := connectedCount(st)
	if nodes != len(c.workers) || dps != len(c.dps) {
		return false, fmt.Sprintf("%d workers, %d data planes connected", nodes, dps)
	}
	table := map[string]string{} // sandbox id -> function
	for _, fn := range []string{"warm", "bg", "dud", "sc"} {
		v, err := cl.Get(context.Background(), fn)
		if err != nil {
			return false, err.Error()
		}
		if fn == "warm" && (v.Status.Ready != 3 || v.Status.Pending != 0 || v.Status.Terminating != 0) {
			return false, fmt.Sprintf("warm: %d ready, %d pending, %d terminating", v.Status.Ready, v.Status.Pending, v.Status.Terminating)
		}
		for _, sb := range v.Status.Sandboxes {
			table[sb.ID] = fn
		}
	}
	for _, dp := range c.dps {
		n, ok := metricSample(c.t, "http://"+dp.Host.Addr(labInvoke)+"/metrics", `brisk_dataplane_endpoints{function="warm"}`)
		if !ok || n != 3 {
			return false, fmt.Sprintf("%s routes warm to %v sandboxes", dp.Host.Name, n)
		}
	}
	running := c.sandboxProcs()
	if !maps.Equal(running, table) {
		return false, fmt.Sprintf("sandbox processes %v, table %v", running, table)
	}
	return true, ""
}

// sandboxProcs are the sandbox processes running on the workers' hosts,
// by their sandbox id (BRISK_SANDBOX_ID in their environment) and
// function.
func (c *labCluster) sandboxProcs() map[string]string {
	var pids []int
	for _, w := range c.workers {
		pids = append(pids, w.Host.Pids()...)
	}
	for _, ns := range lab.Namespaces(c.natPrefix) { // the native worker's
		pids = append(pids, lab.NSPids(ns)...)
	}
	out := map[string]string{}
	for _, pid := range pids {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		var id, fn string
		for kv := range strings.SplitSeq(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "BRISK_SANDBOX_ID="); ok {
				id = v
			} else if v, ok := strings.CutPrefix(kv, "BRISK_FUNCTION="); ok {
				fn = v
			}
		}
		if id != "" {
			out[id] = fn
		}
	}
	return out
}
