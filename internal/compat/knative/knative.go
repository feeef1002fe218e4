// Package knative converts between Knative Serving's Service
// (serving.knative.dev/v1) and brisk's function spec, so that `brisk
// apply -f service.yaml` deploys what `kubectl apply` would give Knative,
// and `brisk get -o yaml` gives a Service back (docs/compatibility.md).
package knative

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// APIVersion and Kind of what is converted.
const (
	APIVersion = "serving.knative.dev/v1"
	Kind       = "Service"
)

// Annotations brisk reads (Knative's autoscaler's) and its own.
const (
	annMinScale    = "autoscaling.knative.dev/min-scale"
	annMaxScale    = "autoscaling.knative.dev/max-scale"
	annTarget      = "autoscaling.knative.dev/target"
	annUtilization = "autoscaling.knative.dev/target-utilization-percentage"
	annWindow      = "autoscaling.knative.dev/window"
	annMetric      = "autoscaling.knative.dev/metric"
	annClass       = "autoscaling.knative.dev/class"
	// AnnBuiltin runs a brisk built-in function instead of the image
	// ("trace"), for clusters without the image.
	AnnBuiltin = "brisk.dev/builtin"
	// AnnPublic "true": anyone may call the function (brisk's auth: public).
	AnnPublic = "brisk.dev/public"
)

// Service is the part of a Knative Service brisk understands.
type Service struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   Metadata `json:"metadata"`
	Spec       struct {
		Template struct {
			Metadata Metadata     `json:"metadata,omitzero"`
			Spec     RevisionSpec `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
	Status *Status `json:"status,omitempty"`
}

// Metadata is a Kubernetes object's metadata, as far as brisk uses it.
type Metadata struct {
	Name        string            `json:"name,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RevisionSpec is a revision template's spec.
type RevisionSpec struct {
	ContainerConcurrency *int64      `json:"containerConcurrency,omitempty"`
	TimeoutSeconds       *int64      `json:"timeoutSeconds,omitempty"`
	Containers           []Container `json:"containers"`
}

// Container is the one container of a revision.
type Container struct {
	Name      string        `json:"name,omitempty"`
	Image     string        `json:"image"`
	Command   []string      `json:"command,omitempty"`
	Args      []string      `json:"args,omitempty"`
	Env       []EnvVar      `json:"env,omitempty"`
	Ports     []Port        `json:"ports,omitempty"`
	Resources *Requirements `json:"resources,omitempty"`
}

// EnvVar is a literal environment variable (valueFrom is not supported).
type EnvVar struct {
	Name      string `json:"name"`
	Value     string `json:"value,omitempty"`
	ValueFrom any    `json:"valueFrom,omitempty"`
}

// Port is a container port; Knative allows one.
type Port struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int    `json:"containerPort"`
}

// Requirements are a container's requests and limits.
type Requirements struct {
	Requests map[string]string `json:"requests,omitempty"`
	Limits   map[string]string `json:"limits,omitempty"`
}

// Status is what `brisk get -o yaml` reports of a Service.
type Status struct {
	URL        string      `json:"url,omitempty"`
	Conditions []Condition `json:"conditions,omitempty"`
}

// Condition is a Knative status condition.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Parse reads one or more YAML (or JSON) documents of Knative Services and
// returns their brisk specs; an error names the document and the field.
func Parse(data []byte) ([]*spec.Function, error) {
	objs, err := ParseAll(data)
	if err != nil {
		return nil, err
	}
	if len(objs.Triggers) > 0 {
		return nil, errors.New("PingSources are not Services: brisk apply takes both")
	}
	return objs.Functions, nil
}

// Objects are the brisk objects a file of Knative resources makes.
type Objects struct {
	Functions []*spec.Function
	Triggers  []*spec.Trigger
}

// ParseAll reads one or more YAML (or JSON) documents of Knative Services
// and PingSources (sources.knative.dev/v1): functions and cron triggers.
func ParseAll(data []byte) (*Objects, error) {
	out := &Objects{}
	for i, doc := range docSep.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm struct {
			APIVersion string   `json:"apiVersion"`
			Kind       string   `json:"kind"`
			Metadata   Metadata `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if tm.Kind == PingSourceKind {
			var ps PingSource
			if err := yaml.UnmarshalStrict([]byte(doc), &ps); err != nil {
				return nil, fmt.Errorf("document %d: %w", i+1, err)
			}
			t, err := ps.ToTrigger()
			if err != nil {
				return nil, fmt.Errorf("document %d (PingSource %s): %w", i+1, ps.Metadata.Name, err)
			}
			out.Triggers = append(out.Triggers, t)
			continue
		}
		var s Service
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		f, err := s.ToSpec()
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, s.Metadata.Name, err)
		}
		out.Functions = append(out.Functions, f)
	}
	if len(out.Functions)+len(out.Triggers) == 0 {
		return nil, errors.New("no Knative Service or PingSource in the input")
	}
	return out, nil
}

// PingSource apiVersions and kind brisk reads.
const (
	PingSourceKind = "PingSource"
	SourcesV1      = "sources.knative.dev/v1"
	SourcesV1Beta2 = "sources.knative.dev/v1beta2"
)

// PingSource is the part of a Knative PingSource brisk understands: it
// becomes a cron trigger of the Service its sink names, whose calls are
// CloudEvents as PingSource sends them (binary mode, type
// dev.knative.sources.ping).
type PingSource struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   Metadata `json:"metadata"`
	Spec       struct {
		Schedule    string      `json:"schedule"`
		Timezone    string      `json:"timezone,omitempty"`
		ContentType string      `json:"contentType,omitempty"`
		Data        string      `json:"data,omitempty"`
		DataBase64  string      `json:"dataBase64,omitempty"`
		Sink        Destination `json:"sink"`
		CEOverrides *struct {
			Extensions map[string]string `json:"extensions,omitempty"`
		} `json:"ceOverrides,omitempty"`
	} `json:"spec"`
	Status map[string]any `json:"status,omitempty"`
}

// Destination is a Knative sink: a reference to a Service (a URI is not
// something brisk can call).
type Destination struct {
	Ref *struct {
		APIVersion string `json:"apiVersion,omitempty"`
		Kind       string `json:"kind"`
		Name       string `json:"name"`
		Namespace  string `json:"namespace,omitempty"`
	} `json:"ref,omitempty"`
	URI string `json:"uri,omitempty"`
}

// ToTrigger converts a PingSource to a brisk cron trigger.
func (p *PingSource) ToTrigger() (*spec.Trigger, error) {
	if p.APIVersion != SourcesV1 && p.APIVersion != SourcesV1Beta2 {
		return nil, fmt.Errorf("apiVersion %q: brisk applies PingSource of %s", p.APIVersion, SourcesV1)
	}
	if p.Metadata.Name == "" {
		return nil, errors.New("metadata.name is required")
	}
	sink := p.Spec.Sink
	if sink.URI != "" || sink.Ref == nil {
		return nil, errors.New("spec.sink: brisk calls a Service of the cluster (sink.ref kind Service), not a URI")
	}
	if sink.Ref.Kind != Kind || sink.Ref.APIVersion != "" && sink.Ref.APIVersion != APIVersion {
		return nil, fmt.Errorf("spec.sink.ref: %s %s: brisk calls a %s %s", sink.Ref.APIVersion, sink.Ref.Kind, APIVersion, Kind)
	}
	ns := p.Metadata.Namespace
	if sink.Ref.Namespace != "" && ns != "" && sink.Ref.Namespace != ns {
		return nil, fmt.Errorf("spec.sink.ref.namespace %q: a trigger calls a function of its own namespace (%q)", sink.Ref.Namespace, ns)
	}
	if ns == "" {
		ns = sink.Ref.Namespace
	}
	data := p.Spec.Data
	if p.Spec.DataBase64 != "" {
		if data != "" {
			return nil, errors.New("spec: data and dataBase64 are exclusive")
		}
		b, err := base64.StdEncoding.DecodeString(p.Spec.DataBase64)
		if err != nil {
			return nil, fmt.Errorf("spec.dataBase64: %w", err)
		}
		data = string(b)
	}
	source := "/apis/v1/namespaces/" + cmp.Or(ns, spec.DefaultNamespace) + "/pingsources/" + p.Metadata.Name
	h := map[string]string{"Ce-Specversion": "1.0", "Ce-Type": "dev.knative.sources.ping", "Ce-Source": source}
	if p.Spec.CEOverrides != nil {
		for k, v := range p.Spec.CEOverrides.Extensions {
			h["Ce-"+k] = v
		}
	}
	t := &spec.Trigger{Name: p.Metadata.Name, Namespace: ns, Function: sink.Ref.Name, Headers: h,
		Cron: &spec.CronSource{Schedule: p.Spec.Schedule, TimeZone: p.Spec.Timezone, Payload: data, ContentType: p.Spec.ContentType}}
	if t.Cron.Payload != "" && t.Cron.ContentType == "" {
		t.Cron.ContentType = "application/json" // PingSource's default
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(doc, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// ToSpec converts a Service to a brisk spec.
func (s *Service) ToSpec() (*spec.Function, error) {
	if s.APIVersion != APIVersion || s.Kind != Kind {
		return nil, fmt.Errorf("apiVersion %q kind %q: brisk applies %s %s only", s.APIVersion, s.Kind, APIVersion, Kind)
	}
	if s.Metadata.Name == "" {
		return nil, errors.New("metadata.name is required")
	}
	f := &spec.Function{Name: s.Metadata.Name, Namespace: s.Metadata.Namespace}
	rs := s.Spec.Template.Spec
	if len(rs.Containers) != 1 {
		return nil, fmt.Errorf("spec.template.spec.containers: want exactly one container (got %d)", len(rs.Containers))
	}
	c := rs.Containers[0]
	ann := merge(s.Metadata.Annotations, s.Spec.Template.Metadata.Annotations)
	switch b := ann[AnnBuiltin]; {
	case b != "":
		f.Builtin = b
	case strings.HasPrefix(c.Image, spec.BuiltinImagePrefix):
		f.Builtin = strings.TrimPrefix(c.Image, spec.BuiltinImagePrefix)
	case c.Image == "":
		return nil, errors.New("containers[0].image is required")
	default:
		f.Image = c.Image
		if len(c.Command) > 0 || len(c.Args) > 0 {
			return nil, errors.New("containers[0].command/args: brisk runs an image's own entrypoint (set it in the image)")
		}
	}
	if ann[AnnPublic] == "true" {
		f.Auth = spec.AuthPublic
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			return nil, fmt.Errorf("env %s: valueFrom is not supported; give a value", e.Name)
		}
		if f.Env == nil {
			f.Env = map[string]string{}
		}
		f.Env[e.Name] = e.Value
	}
	switch len(c.Ports) {
	case 0:
	case 1:
		f.Port = c.Ports[0].ContainerPort
	default:
		return nil, errors.New("containers[0].ports: Knative allows one port")
	}
	if r := c.Resources; r != nil {
		var err error
		if f.Resources.MilliCPU, err = spec.ParseMilliCPU(r.Requests["cpu"]); err != nil {
			return nil, fmt.Errorf("resources.requests.cpu: %w", err)
		}
		if f.Resources.MemoryMB, err = spec.ParseMemoryMB(r.Requests["memory"]); err != nil {
			return nil, fmt.Errorf("resources.requests.memory: %w", err)
		}
		if f.Limits.MilliCPU, err = spec.ParseMilliCPU(r.Limits["cpu"]); err != nil {
			return nil, fmt.Errorf("resources.limits.cpu: %w", err)
		}
		if f.Limits.MemoryMB, err = spec.ParseMemoryMB(r.Limits["memory"]); err != nil {
			return nil, fmt.Errorf("resources.limits.memory: %w", err)
		}
	}
	if cc := rs.ContainerConcurrency; cc != nil {
		if *cc == 0 {
			return nil, errors.New("containerConcurrency 0 (unlimited) is not supported yet: give a limit")
		}
		f.Concurrency = int(*cc)
	}
	if ts := rs.TimeoutSeconds; ts != nil {
		f.Timeout = spec.Duration(time.Duration(*ts) * time.Second)
	}
	var err error
	num := func(key string, set func(float64)) {
		if v, ok := ann[key]; ok && err == nil {
			x, perr := strconv.ParseFloat(v, 64)
			if perr != nil || math.IsNaN(x) || x < 0 {
				err = fmt.Errorf("annotation %s: %q is not a non-negative number", key, v)
				return
			}
			set(x)
		}
	}
	// Knative's scale-to-zero: idle sandboxes leave after the stable window
	// and the grace, not brisk's default gd keep-alive.
	f.Scaling.KeepAlivePolicy = spec.KeepAliveTTL
	num(annMinScale, func(x float64) { f.Scaling.Min = int(x) })
	num(annMaxScale, func(x float64) { f.Scaling.Max = int(x) })
	num(annTarget, func(x float64) { f.Scaling.Target = x })
	num(annUtilization, func(x float64) { f.Scaling.TargetUtilization = x / 100 })
	if err != nil {
		return nil, err
	}
	if v, ok := ann[annWindow]; ok {
		d, perr := time.ParseDuration(v)
		if perr != nil {
			return nil, fmt.Errorf("annotation %s: %q is not a duration", annWindow, v)
		}
		f.Scaling.StableWindow = spec.Duration(d)
	}
	if m, ok := ann[annMetric]; ok && m != "concurrency" {
		return nil, fmt.Errorf("annotation %s: %q: brisk scales on concurrency only", annMetric, m)
	}
	if cl, ok := ann[annClass]; ok && cl != "kpa.autoscaling.knative.dev" {
		return nil, fmt.Errorf("annotation %s: %q: brisk's autoscaler is the KPA", annClass, cl)
	}
	return f, nil
}

func merge(a, b map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}

// FromSpec renders a brisk function as a Knative Service; url and ready
// fill its status (url empty: no status).
func FromSpec(f *spec.Function, url string, ready bool, message string) *Service {
	s := &Service{APIVersion: APIVersion, Kind: Kind}
	s.Metadata = Metadata{Name: spec.ShortName(f.Name), Namespace: f.Namespace}
	ann := map[string]string{}
	if f.Scaling.Min != 0 {
		ann[annMinScale] = strconv.Itoa(f.Scaling.Min)
	}
	if f.Scaling.Max != 0 {
		ann[annMaxScale] = strconv.Itoa(f.Scaling.Max)
	}
	if f.Scaling.Target != 0 {
		ann[annTarget] = strconv.FormatFloat(f.Scaling.Target, 'f', -1, 64)
	}
	if f.Scaling.TargetUtilization != 0 {
		ann[annUtilization] = strconv.FormatFloat(f.Scaling.TargetUtilization*100, 'f', -1, 64)
	}
	if f.Scaling.StableWindow != 0 {
		ann[annWindow] = time.Duration(f.Scaling.StableWindow).String()
	}
	if f.Builtin != "" {
		ann[AnnBuiltin] = f.Builtin
	}
	if f.Auth == spec.AuthPublic {
		ann[AnnPublic] = "true"
	}
	if len(ann) > 0 {
		s.Spec.Template.Metadata.Annotations = ann
	}
	c := Container{Image: f.Image}
	if f.Builtin != "" && c.Image == "" {
		c.Image = spec.BuiltinImagePrefix + f.Builtin // for Knative tools: brisk runs the built-in
	}
	for k, v := range f.Env {
		c.Env = append(c.Env, EnvVar{Name: k, Value: v})
	}
	sortEnv(c.Env)
	if f.Port != 0 {
		c.Ports = []Port{{ContainerPort: f.Port}}
	}
	req := map[string]string{}
	if f.Resources.MilliCPU != 0 {
		req["cpu"] = strconv.FormatInt(f.Resources.MilliCPU, 10) + "m"
	}
	if f.Resources.MemoryMB != 0 {
		req["memory"] = strconv.FormatInt(f.Resources.MemoryMB, 10) + "Mi"
	}
	lim := map[string]string{}
	if f.Limits.MilliCPU != 0 {
		lim["cpu"] = strconv.FormatInt(f.Limits.MilliCPU, 10) + "m"
	}
	if f.Limits.MemoryMB != 0 {
		lim["memory"] = strconv.FormatInt(f.Limits.MemoryMB, 10) + "Mi"
	}
	if len(req) > 0 || len(lim) > 0 {
		c.Resources = &Requirements{Requests: req, Limits: lim}
	}
	s.Spec.Template.Spec.Containers = []Container{c}
	if f.Concurrency != 0 {
		cc := int64(f.Concurrency)
		s.Spec.Template.Spec.ContainerConcurrency = &cc
	}
	if f.Timeout != 0 {
		ts := int64(time.Duration(f.Timeout) / time.Second)
		s.Spec.Template.Spec.TimeoutSeconds = &ts
	}
	if url != "" {
		st := &Status{URL: url}
		cond := Condition{Type: "Ready", Status: "True"}
		if !ready {
			cond.Status, cond.Reason, cond.Message = "Unknown", "NoReadySandbox", message
		}
		st.Conditions = []Condition{cond}
		s.Status = st
	}
	return s
}

func sortEnv(e []EnvVar) {
	for i := 1; i < len(e); i++ {
		for j := i; j > 0 && e[j].Name < e[j-1].Name; j-- {
			e[j], e[j-1] = e[j-1], e[j]
		}
	}
}

// YAML renders services as YAML documents separated by ---.
func YAML(svcs ...*Service) ([]byte, error) {
	var b bytes.Buffer
	for i, s := range svcs {
		if i > 0 {
			b.WriteString("---\n")
		}
		y, err := yaml.Marshal(s)
		if err != nil {
			return nil, err
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}
