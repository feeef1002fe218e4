package dataplane

import (
	"strings"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// splitSlots is how many calls one round of a traffic split spans: with
// percents, every 100 consecutive calls go exactly by them.
const splitSlots = 100

// split is a function's traffic split resolved for the hot path: slot i
// names the function that serves the i-th call of each round. The slots
// are laid out by smooth weighted round robin, so the shares interleave
// (90/10 sends one call in ten to the second target, not ten in a row).
type split struct {
	slots [splitSlots]string
}

// newSplit resolves a wire split; nil when every call stays with self.
func newSplit(self string, ts []*briskv1.TrafficTarget) *split {
	type target struct {
		name          string
		weight, score int
	}
	var tg []target
	other := false
	for _, t := range ts {
		if t.GetPercent() == 0 || t.GetFunction() == "" {
			continue
		}
		tg = append(tg, target{name: t.GetFunction(), weight: int(t.GetPercent())})
		other = other || t.GetFunction() != self
	}
	if !other {
		return nil
	}
	total := 0
	for _, t := range tg {
		total += t.weight
	}
	s := &split{}
	for i := range s.slots {
		best := 0
		for j := range tg {
			tg[j].score += tg[j].weight
			if tg[j].score > tg[best].score {
				best = j
			}
		}
		tg[best].score -= total
		s.slots[i] = tg[best].name
	}
	return s
}

// splitTarget picks the function that serves fn's next call under its
// split: the named revision function, or fn itself when that target is not
// (or no longer) in the routing table.
func (d *DataPlane) splitTarget(fn *function, sp *split) *function {
	name := sp.slots[(fn.splitSeq.Add(1)-1)%splitSlots]
	if name == fn.name {
		return fn
	}
	if t := d.lookup(name); t != nil {
		return t
	}
	return fn
}

// lookupCall returns the function a caller names, or nil. A split's
// revision functions are reached only through their function's split, under
// its token rule and weights: a caller naming one finds nothing.
func (d *DataPlane) lookupCall(name string) *function {
	if spec.IsRevisionFunction(name) {
		return nil
	}
	return d.lookup(name)
}

// lookupNamed returns the function a path names: NAME, or NAME.NAMESPACE
// (outside the default namespace a function's name is that, spec.Qualify).
// When no function has that full name, NAME.NAMESPACE also reaches the
// function NAME of that namespace: OpenFaaS clients address the default
// namespace's functions as NAME.openfaas-fn, and functions made before
// names were per namespace kept bare names.
func (d *DataPlane) lookupNamed(name string) *function {
	if fn := d.lookupCall(name); fn != nil {
		return fn
	}
	short, ns, ok := strings.Cut(name, ".")
	if !ok {
		return nil
	}
	fn := d.lookupCall(short)
	if fn == nil {
		return nil
	}
	if has := fn.set.Load().Conf.namespace; has == ns || has == spec.DefaultNamespace && ns == openfaasNamespace {
		return fn
	}
	return nil
}

// openfaasNamespace is OpenFaaS's name for the default namespace.
const openfaasNamespace = "openfaas-fn"

// lookupHost returns the function a Host names by its first two labels
// (first, two: naming.HostLabels). When the second label is a namespace
// (of a function this data plane knows), the Host is Knative's
// NAME.NAMESPACE.DOMAIN and names NAME of that namespace: NAME.NAMESPACE,
// or a bare NAME of that namespace (made before names were per
// namespace) — never a function of another namespace, which would take a
// tenant's calls, and their tokens, while its own function is away.
// Otherwise the second label is the domain's (NAME.example.com; or there
// is none, NAME:8080) and the first names a function of the default
// namespace, or a bare-named one.
func (d *DataPlane) lookupHost(first, two string) *function {
	if len(two) == len(first) {
		return d.lookupCall(first)
	}
	ns := two[len(first)+1:]
	if ns == spec.DefaultNamespace {
		return d.lookupCall(first)
	}
	if m := d.namespaces.Load(); m != nil && (*m)[ns] {
		if fn := d.lookupCall(two); fn != nil {
			return fn
		}
		if fn := d.lookupCall(first); fn != nil && fn.set.Load().Conf.namespace == ns {
			return fn
		}
		return nil
	}
	return d.lookupCall(first)
}

// namespaceOfFn is fn's namespace, "" for none.
func namespaceOfFn(fn *function) string {
	if fn == nil {
		return ""
	}
	if s := fn.set.Load(); s != nil {
		return s.Conf.namespace
	}
	return ""
}
