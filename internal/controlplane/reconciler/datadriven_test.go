package reconciler

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// TestScenarios runs testdata/*.txt: each file is a story of events
// stepped into one reconciler and the commands it answered, with the
// workers' replies in between, so that a reader learns the state protocol
// (docs/design/) from them. After a change that alters the commands on
// purpose, `go test ./internal/controlplane/reconciler -run TestScenarios
// -rewrite` writes the new answers; the diff is the change's review.
//
// Directives (one per block, its output below "----"):
//
//	world nodes=N [cpu=M] [mem=MiB]      a new reconciler with N live nodes n0..
//	deploy name=F [min=N] [max=N] [keep-alive=ttl|gd] [cpu=M] [mem=MiB] [rev=R]
//	remove name=F                        the function is deleted
//	call name=F [queued=N] [busy=(G,...)] [idle=(G,...)]   a data plane's urgent report: F's calls
//	                                     wait with no capacity; it lists the functions whose calls in
//	                                     flight changed since its last report: now one (busy) or none (idle)
//	load name=F conc=C [requests=N] [in-flight=N]   a data plane's periodic report
//	advance by=D                         the clock moves on (no event)
//	idle for=D                           every second: the load sample and a tick (outputs carry their time)
//	sample | tick | check-nodes          one event each
//	down node=N [withdraw]               the node's link goes down
//	up node=N [lost=(ID,...)]            the node's handshake: it reports what it runs, less lost ids
//	report node=N id=ID state=S version=V [function=F]   a worker's record
//	fail | heal                          workers fail new sandboxes from now on, or start them again
//	retry name=F                         the retry timer a RetryAt asked for fires
//	status name=F                        the function as `brisk fn get` shows it
//	snapshot                             what a data plane that connects now starts from
//
// Workers answer at once: a Create with the sandbox ready (or failed), a
// Tombstone with it gone. Their replies show as "nN: ID STATE".
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var w *world
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "world" && w == nil {
				d.Fatalf(t, "%s before world", d.Cmd)
			}
			if w != nil {
				w.t, w.trace = t, nil
			}
			switch d.Cmd {
			case "world":
				cfg := Config{Autoscale: autoscale.DefaultConfig(), NodeGrace: 10 * time.Second,
					FailureBackoff: 200 * time.Millisecond, MaxFailureBackoff: 30 * time.Second, Seed: 1, IDPrefix: "s"}
				r, err := New(cfg)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				w = &world{t: t, r: r, now: time.Unix(1_000_000, 0), start: time.Unix(1_000_000, 0),
					running: map[string]map[string]string{}, tracing: true}
				capa := spec.Resources{MilliCPU: int64(intArg(t, d, "cpu", 4000)), MemoryMB: int64(intArg(t, d, "mem", 8192))}
				for i := range intArg(t, d, "nodes", 1) {
					id := fmt.Sprintf("n%d", i)
					w.step(RegisterNode{Worker: &nodes.Worker{ID: id, Address: "127.0.0.1:1", Capacity: capa}})
					w.running[id] = map[string]string{}
					w.step(SessionUp{Node: id})
				}
			case "deploy":
				f := &spec.Function{Name: strArg(t, d, "name", ""), Builtin: "echo", Concurrency: 1, Revision: uint64(intArg(t, d, "rev", 1)),
					Resources: spec.Resources{MilliCPU: int64(intArg(t, d, "cpu", 100)), MemoryMB: int64(intArg(t, d, "mem", 128))},
					Scaling:   spec.Scaling{Min: intArg(t, d, "min", 0), Max: intArg(t, d, "max", 0), KeepAlivePolicy: optArg(t, d, "keep-alive")}}
				w.step(UpsertFunction{Spec: f})
			case "remove":
				w.step(RemoveFunction{Name: strArg(t, d, "name", "")})
			case "call":
				rep := LoadReport{DataPlane: "dp", Urgent: true,
					Functions: []FunctionLoad{{Function: strArg(t, d, "name", ""), Queued: intArg(t, d, "queued", 1), NoCapacity: true}}}
				var busy []string
				if d.HasArg("busy") {
					d.ScanArgs(t, "busy", &busy)
				}
				for _, b := range busy {
					rep.Functions = append(rep.Functions, FunctionLoad{Function: b, InFlight: 1})
				}
				var idle []string
				if d.HasArg("idle") {
					d.ScanArgs(t, "idle", &idle)
				}
				for _, b := range idle {
					rep.Functions = append(rep.Functions, FunctionLoad{Function: b})
				}
				w.step(Metrics{Report: rep})
			case "load":
				conc, err := strconv.ParseFloat(strArg(t, d, "conc", "0"), 64)
				if err != nil {
					d.Fatalf(t, "conc: %v", err)
				}
				w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second, Functions: []FunctionLoad{{
					Function: strArg(t, d, "name", ""), AvgConcurrency: conc, Requests: int64(intArg(t, d, "requests", 1)),
					InFlight: intArg(t, d, "in-flight", 0)}}}})
			case "advance":
				w.now = w.now.Add(durArg(t, d, "by"))
				return fmt.Sprintf("t=%s", w.now.Sub(w.start))
			case "idle":
				for end := w.now.Add(durArg(t, d, "for")); w.now.Before(end); {
					w.now = w.now.Add(time.Second)
					from := len(w.trace)
					w.step(SampleLoad{})
					w.step(Tick{})
					for i := from; i < len(w.trace); i++ {
						w.trace[i] = fmt.Sprintf("t=%s: %s", w.now.Sub(w.start), w.trace[i])
					}
				}
				w.trace = append(w.trace, fmt.Sprintf("t=%s", w.now.Sub(w.start)))
			case "sample":
				w.step(SampleLoad{})
			case "tick":
				w.step(Tick{})
			case "check-nodes":
				w.step(CheckNodes{})
			case "down":
				w.step(SessionDown{Node: strArg(t, d, "node", ""), Withdraw: d.HasArg("withdraw")})
			case "up":
				node := strArg(t, d, "node", "")
				var lost []string
				if d.HasArg("lost") {
					d.ScanArgs(t, "lost", &lost)
				}
				var ev = SessionUp{Node: node}
				for _, id := range sortedKeys(w.running[node]) {
					if slices.Contains(lost, id) {
						delete(w.running[node], id)
						continue
					}
					w.version++
					ev.Versions = append(ev.Versions, Version{ID: id, Version: w.version})
					ev.Records = append(ev.Records, Record{ID: id, Function: w.running[node][id], Revision: 1, State: StateReady,
						Version: w.version, Address: "10.0.0.1:" + id})
				}
				w.step(ev)
			case "report":
				st := map[string]SandboxState{"creating": StateCreating, "ready": StateReady, "terminating": StateTerminating,
					"gone": StateGone, "failed": StateFailed, "exited": StateExited}[strArg(t, d, "state", "")]
				if st == StateUnknown {
					d.Fatalf(t, "state: want creating, ready, terminating, gone, failed or exited")
				}
				w.step(WorkerUpdates{Node: strArg(t, d, "node", ""), Updates: Updates{Records: []Record{{ID: strArg(t, d, "id", ""),
					Function: strArg(t, d, "function", ""), Revision: 1, State: st, Version: uint64(intArg(t, d, "version", 0))}}}})
			case "fail":
				w.fail = true
				return "workers fail new sandboxes"
			case "heal":
				w.fail = false
				return "workers start new sandboxes"
			case "retry":
				w.step(Retry{Function: strArg(t, d, "name", "")})
			case "status":
				st, ok := w.r.FunctionStatus(strArg(t, d, "name", ""))
				if !ok {
					return "no such function"
				}
				out := fmt.Sprintf("desired=%d ready=%d pending=%d terminating=%d", st.Desired, st.Ready, st.Pending, st.Terminating)
				if st.Condition != "" {
					out += fmt.Sprintf(" condition=%s (%s)", st.Condition, st.Message)
				}
				var sbs []string
				for _, sb := range st.Sandboxes {
					sbs = append(sbs, fmt.Sprintf("%s %s on %s", sb.ID, sb.State, sb.Node))
				}
				if len(sbs) > 0 {
					slices.Sort(sbs)
					out += "\nsandboxes: " + strings.Join(sbs, ", ")
				}
				return out
			case "snapshot":
				snap := w.r.Snapshot()
				var lines []string
				for _, p := range snap.Functions {
					lines = append(lines, "function "+p.Spec.Name)
				}
				for _, c := range snap.Conditions {
					lines = append(lines, fmt.Sprintf("condition %s %s", c.Function, c.Reason))
				}
				for _, e := range snap.Endpoints {
					lines = append(lines, fmt.Sprintf("endpoint %s (%s on %s)", e.SandboxID, e.Function, e.Node))
				}
				slices.Sort(lines)
				return strings.Join(lines, "\n")
			default:
				d.Fatalf(t, "unknown directive %q", d.Cmd)
			}
			if len(w.trace) == 0 {
				return "ok"
			}
			return strings.Join(w.trace, "\n")
		})
	})
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func strArg(t *testing.T, d *datadriven.TestData, key, def string) string {
	if !d.HasArg(key) {
		if def == "" {
			d.Fatalf(t, "%s: missing %s=", d.Cmd, key)
		}
		return def
	}
	var v string
	d.ScanArgs(t, key, &v)
	return v
}

func optArg(t *testing.T, d *datadriven.TestData, key string) string {
	var v string
	if d.HasArg(key) {
		d.ScanArgs(t, key, &v)
	}
	return v
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func durArg(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	v, err := time.ParseDuration(strArg(t, d, key, ""))
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

// describe renders a command for a scenario's output, with times relative
// to now.
func describe(c Command, now time.Time) string {
	switch x := c.(type) {
	case Create:
		return fmt.Sprintf("create %s on %s (%s rev %d)", x.ID, x.Node, x.Spec.Name, x.Spec.Revision)
	case Offer:
		return fmt.Sprintf("offer %s to %s", x.Spec.Name, x.Node)
	case Tombstone:
		if x.After > 0 {
			return fmt.Sprintf("tombstone %s on %s after %s", x.ID, x.Node, x.After)
		}
		return fmt.Sprintf("tombstone %s on %s", x.ID, x.Node)
	case Verify:
		return fmt.Sprintf("verify %s on %s", x.ID, x.Node)
	case AddEndpoint:
		return fmt.Sprintf("add endpoint %s (%s on %s)", x.Endpoint.SandboxID, x.Endpoint.Function, x.Endpoint.Node)
	case RemoveEndpoint:
		return "remove endpoint " + x.ID
	case PublishFunction:
		return fmt.Sprintf("publish %s (scaling %s, keep-alive %s)", x.Function.Spec.Name, x.Function.ScalingMode, x.Function.KeepAlive)
	case DeleteFunction:
		return "delete function " + x.Name
	case SetCondition:
		if x.Condition.Reason == "" {
			return "condition " + x.Condition.Function + " cleared"
		}
		ff := ""
		if x.Condition.FailFast {
			ff = ", fail fast"
		}
		return fmt.Sprintf("condition %s %s%s: %s", x.Condition.Function, x.Condition.Reason, ff, x.Condition.Message)
	case SetEmergencyWorkers:
		return fmt.Sprintf("emergency workers %d", len(x.Workers))
	case RetryAt:
		return fmt.Sprintf("retry %s in %s", x.Function, x.At.Sub(now))
	case PersistWorker:
		return fmt.Sprintf("persist %s drain=%v", x.Worker.ID, x.Worker.Drain)
	case SandboxFailed:
		return fmt.Sprintf("sandbox failed %s on %s: %s %q, back off %s", x.ID, x.Node, x.State, x.Reason, x.Backoff)
	}
	return fmt.Sprintf("%T%+v", c, c)
}
