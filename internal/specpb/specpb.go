// Package specpb converts function specs (pkg/spec) to and from their wire
// form (api/brisk/v1), apart from pkg/spec so that the JSON SDK
// (pkg/client) links no gRPC or protobuf.
package specpb

import (
	"maps"
	"slices"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ToProto converts to the wire form sent to workers and data planes.
func ToProto(f *spec.Function) *briskv1.FunctionSpec {
	return &briskv1.FunctionSpec{
		Name:           f.Name,
		Revision:       f.Revision,
		Builtin:        f.Builtin,
		Command:        f.Command,
		Image:          f.Image,
		Port:           int32(f.Port),
		Env:            f.Env,
		Resources:      &briskv1.Resources{MilliCpu: f.Resources.MilliCPU, MemoryMb: f.Resources.MemoryMB},
		Limits:         limitsToProto(f.Limits),
		Concurrency:    int32(f.Concurrency),
		QueueDepth:     int32(f.Queue.Depth),
		QueueTimeoutMs: time.Duration(f.Queue.Timeout).Milliseconds(),
		TimeoutMs:      time.Duration(f.Timeout).Milliseconds(),
		LoadBalancing:  f.LoadBalancing,
		WritableRoot:   f.WritableRoot,
		StreamRequests: f.StreamRequests,
		Auth:           f.Auth,
		Namespace:      f.Namespace,
		ScalingMode:    f.Scaling.Mode,
		Async:          asyncToProto(f.Async),
		Secrets:        f.Secrets,
		SecretData:     f.SecretData,
		Traffic:        trafficToProto(f),
		Uid:            f.UID,
		Code:           codeToProto(f.Code),
	}
}

func codeToProto(c *spec.Code) *briskv1.FunctionCode {
	if c == nil {
		return nil
	}
	return &briskv1.FunctionCode{Language: c.Language, Handler: c.Handler, Contract: c.Contract, Digest: c.Digest}
}

// limitsToProto leaves zero limits out: every receiver reads them through
// nil-safe getters, and a registration burst then makes and decodes one
// message less per function at each end.
func limitsToProto(l spec.Resources) *briskv1.Resources {
	if l == (spec.Resources{}) {
		return nil
	}
	return &briskv1.Resources{MilliCpu: l.MilliCPU, MemoryMb: l.MemoryMB}
}

// asyncToProto sends the policy with its defaults applied; a function
// that sets none gets none on the wire (AsyncFromProto applies the same
// defaults), as limitsToProto.
func asyncToProto(a spec.Async) *briskv1.AsyncPolicy {
	if a == (spec.Async{}) {
		return nil
	}
	a = a.WithDefaults()
	return &briskv1.AsyncPolicy{
		MaxAttempts:         int32(a.MaxAttempts),
		MaxAgeMs:            time.Duration(a.MaxAge).Milliseconds(),
		BackoffMs:           time.Duration(a.Backoff).Milliseconds(),
		BackoffMaxMs:        time.Duration(a.BackoffMax).Milliseconds(),
		RetryFunctionErrors: a.RetryFunctionErrors,
		Concurrency:         int32(a.Concurrency),
	}
}

// AsyncFromProto converts the wire form back, defaults filling what a
// sender left zero.
func AsyncFromProto(p *briskv1.AsyncPolicy) spec.Async {
	ms := func(v int64) spec.Duration { return spec.Duration(time.Duration(v) * time.Millisecond) }
	return spec.Async{
		MaxAttempts:         int(p.GetMaxAttempts()),
		MaxAge:              ms(p.GetMaxAgeMs()),
		Backoff:             ms(p.GetBackoffMs()),
		BackoffMax:          ms(p.GetBackoffMaxMs()),
		RetryFunctionErrors: p.GetRetryFunctionErrors(),
		Concurrency:         int(p.GetConcurrency()),
	}.WithDefaults()
}

// FromProto converts the wire form back. Scaling is not on the wire: only
// the control plane needs it.
func FromProto(p *briskv1.FunctionSpec) *spec.Function {
	f := &spec.Function{
		Name:           p.GetName(),
		Revision:       p.GetRevision(),
		Builtin:        p.GetBuiltin(),
		Command:        p.GetCommand(),
		Image:          p.GetImage(),
		Port:           int(p.GetPort()),
		Env:            p.GetEnv(),
		Resources:      spec.Resources{MilliCPU: p.GetResources().GetMilliCpu(), MemoryMB: p.GetResources().GetMemoryMb()},
		Limits:         spec.Resources{MilliCPU: p.GetLimits().GetMilliCpu(), MemoryMB: p.GetLimits().GetMemoryMb()},
		Concurrency:    int(p.GetConcurrency()),
		Queue:          spec.Queue{Depth: int(p.GetQueueDepth()), Timeout: spec.Duration(time.Duration(p.GetQueueTimeoutMs()) * time.Millisecond)},
		Timeout:        spec.Duration(time.Duration(p.GetTimeoutMs()) * time.Millisecond),
		LoadBalancing:  p.GetLoadBalancing(),
		WritableRoot:   p.GetWritableRoot(),
		StreamRequests: p.GetStreamRequests(),
		Auth:           p.GetAuth(),
		Namespace:      p.GetNamespace(),
		Async:          AsyncFromProto(p.GetAsync()),
		Secrets:        p.GetSecrets(),
		SecretData:     p.GetSecretData(),
		UID:            p.GetUid(),
	}
	if c := p.GetCode(); c != nil {
		f.Code = &spec.Code{Language: c.GetLanguage(), Handler: c.GetHandler(), Contract: c.GetContract(), Digest: c.GetDigest()}
	}
	for _, t := range p.GetTraffic() {
		f.Traffic = append(f.Traffic, spec.TrafficTarget{Revision: t.GetRevision(), Percent: int(t.GetPercent())})
	}
	return f
}

// trafficToProto resolves each target to the function that serves it.
func trafficToProto(f *spec.Function) []*briskv1.TrafficTarget {
	if len(f.Traffic) == 0 {
		return nil
	}
	out := make([]*briskv1.TrafficTarget, len(f.Traffic))
	for i, t := range f.Traffic {
		out[i] = &briskv1.TrafficTarget{Function: f.TrafficFunction(t), Revision: t.Revision, Percent: uint32(t.Percent)}
	}
	return out
}

// EgressToProto is every namespace's egress policy (by namespace) as
// workers get it: namespaces in name order, those without a policy left
// out.
func EgressToProto(policies map[string]spec.EgressPolicy) *briskv1.EgressPolicies {
	out := &briskv1.EgressPolicies{}
	for _, ns := range slices.Sorted(maps.Keys(policies)) {
		p := policies[ns]
		if p.IsZero() {
			continue
		}
		rules := func(rs []spec.EgressRule) []*briskv1.EgressRule {
			out := make([]*briskv1.EgressRule, len(rs))
			for i, r := range rs {
				out[i] = &briskv1.EgressRule{Cidr: r.CIDR, Ports: r.Ports, Protocol: r.Protocol}
			}
			return out
		}
		out.Namespaces = append(out.Namespaces, &briskv1.NamespaceEgress{Namespace: ns, Allow: rules(p.Allow), Deny: rules(p.Deny)})
	}
	return out
}

// EgressFromProto is EgressToProto's inverse.
func EgressFromProto(e *briskv1.EgressPolicies) map[string]spec.EgressPolicy {
	rules := func(rs []*briskv1.EgressRule) []spec.EgressRule {
		out := make([]spec.EgressRule, len(rs))
		for i, r := range rs {
			out[i] = spec.EgressRule{CIDR: r.GetCidr(), Ports: r.GetPorts(), Protocol: r.GetProtocol()}
		}
		return out
	}
	out := make(map[string]spec.EgressPolicy, len(e.GetNamespaces()))
	for _, ns := range e.GetNamespaces() {
		out[ns.GetNamespace()] = spec.EgressPolicy{Allow: rules(ns.GetAllow()), Deny: rules(ns.GetDeny())}
	}
	return out
}
