package spec

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Trigger makes calls to a function on its own: on a schedule (Cron) or
// for each message on a NATS subject (NATS). Every firing is an
// asynchronous call, with the queue's retries, dead letters and results
// (docs/triggers.md). A trigger lives in its function's namespace and is
// deleted with its function.
type Trigger struct {
	// Name is unique in its namespace (a DNS label).
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	// Function is the function called, of the same namespace.
	Function string `json:"function"`
	// Exactly one source.
	Cron *CronSource `json:"cron,omitempty"`
	NATS *NATSSource `json:"nats,omitempty"`
	// Paused triggers do not fire; a cron trigger resumed fires from the
	// next tick on (ticks while paused are not caught up).
	Paused bool `json:"paused,omitempty"`
	// Path is where the call goes, as after /function/NAME; default "/".
	Path string `json:"path,omitempty"`
	// Headers are added to every call (at most 32; not hop-by-hop ones,
	// Host, Content-Length or Authorization). With Ce-Specversion among
	// them, each call is a CloudEvent in binary mode: brisk adds Ce-Id
	// (the call id) and, for cron, Ce-Time (the tick).
	Headers map[string]string `json:"headers,omitempty"`
	// Managed says what made the trigger, when not a client: ManagedBy
	// Annotations (its function's OpenFaaS connector annotations, which
	// own it: it changes and goes with them).
	Managed string `json:"managed,omitempty"`

	// Set by the control plane.
	UID         string    `json:"uid,omitempty"`
	FunctionUID string    `json:"function_uid,omitempty"`
	CreatedAt   time.Time `json:"created_at,omitzero"`
}

// CronSource fires on a schedule.
type CronSource struct {
	// Schedule: five fields (minute hour day-of-month month day-of-week),
	// a descriptor (@hourly, @daily, @weekly, @monthly, @yearly) or
	// "@every DURATION" (at least one second).
	Schedule string `json:"schedule"`
	// TimeZone is an IANA zone the fields are read in; default UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// Payload is each call's body; ContentType its Content-Type (default
	// text/plain when there is a payload).
	Payload     string `json:"payload,omitempty"`
	ContentType string `json:"content_type,omitempty"`
	// CatchUp says what happens to ticks missed while no control plane
	// could fire them (an outage): CatchUpOnce (the default) fires the
	// latest missed tick once on recovery; CatchUpSkip fires none that is
	// more than CronGrace late.
	CatchUp string `json:"catch_up,omitempty"`
	// Start, when set, is when the schedule begins: no tick comes before
	// it, and "@every D" ticks at Start, Start+D, Start+2D... (without
	// it, D after the trigger is made or its schedule changed, and every D
	// from there). A rate with a phase: "@every 6h" from 03:15.
	Start time.Time `json:"start,omitzero"`
}

// NATSSource makes a call of every message on a subject.
type NATSSource struct {
	// Subject may hold wildcards (* and a last >). On the cluster's own
	// NATS (no URL) it must lie under the trigger's namespace:
	// NAMESPACE.something.
	Subject string `json:"subject"`
	// URL is an external NATS server (nats://host:port or tls://...,
	// several comma-separated); empty: the cluster's NATS.
	URL string `json:"url,omitempty"`
	// CredentialsSecret names a secret of the namespace holding the
	// external server's credentials: "user:password", a token, or a
	// .creds file (JWT and seed).
	CredentialsSecret string `json:"credentials_secret,omitempty"`
	// Stream, when set, names a JetStream stream holding the subject:
	// brisk reads it with a durable consumer and acknowledges a message
	// only once its call is queued (at least once). Without it, messages
	// published while the trigger is not subscribed are lost (core NATS).
	Stream string `json:"stream,omitempty"`
}

// Trigger kinds and catch-up modes.
const (
	TriggerCron = "cron"
	TriggerNATS = "nats"
	CatchUpOnce = "once"
	CatchUpSkip = "skip"
	// CronGrace is how late a tick may fire and still be on time: a
	// catch_up skip trigger fires a tick later than this not at all.
	CronGrace = 10 * time.Second
	// MaxTriggerPayload bounds a cron trigger's payload.
	MaxTriggerPayload = 256 << 10
	// MaxTriggersPerNamespace bounds the triggers of one namespace: the
	// control plane runs them all.
	MaxTriggersPerNamespace = 1000
)

// ErrInvalidTrigger marks a trigger that fails validation.
var ErrInvalidTrigger = errors.New("invalid trigger")

// Kind is TriggerCron or TriggerNATS ("" when neither source is set).
func (t *Trigger) Kind() string {
	switch {
	case t.Cron != nil:
		return TriggerCron
	case t.NATS != nil:
		return TriggerNATS
	}
	return ""
}

// TriggerNamespace is t's namespace, the default one when unset.
func TriggerNamespace(t *Trigger) string {
	if t.Namespace == "" {
		return DefaultNamespace
	}
	return t.Namespace
}

// cronParser reads standard five-field expressions and descriptors.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseSchedule reads a cron source's schedule in its time zone.
func ParseSchedule(c *CronSource) (cron.Schedule, error) {
	s := strings.TrimSpace(c.Schedule)
	if s == "" {
		return nil, errors.New("schedule: required")
	}
	if strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ=") {
		return nil, errors.New("schedule: give the time zone in time_zone, not in the expression")
	}
	loc := time.UTC
	if c.TimeZone != "" {
		var err error
		if loc, err = time.LoadLocation(c.TimeZone); err != nil || c.TimeZone == "Local" {
			return nil, fmt.Errorf("time_zone %q: not an IANA time zone (e.g. Europe/Berlin)", c.TimeZone)
		}
	}
	if rest, ok := strings.CutPrefix(s, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil || d < time.Second {
			return nil, fmt.Errorf("schedule %q: @every wants a duration of at least 1s (e.g. @every 5m)", s)
		}
	}
	sched, err := cronParser.Parse("CRON_TZ=" + loc.String() + " " + s)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %v (want five fields: minute hour day-of-month month day-of-week, or @hourly, @daily, @every 5m...)", s, err)
	}
	// An expression no date matches (0 0 30 2 *) never fires.
	if sched.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("schedule %q: never fires", s)
	}
	if c.Start.IsZero() {
		return sched, nil
	}
	if every, ok := sched.(cron.ConstantDelaySchedule); ok {
		return anchoredEvery{start: c.Start, every: every.Delay}, nil
	}
	return notBefore{Schedule: sched, start: c.Start}, nil
}

// anchoredEvery ticks at start + k·every (k ≥ 0).
type anchoredEvery struct {
	start time.Time
	every time.Duration
}

func (a anchoredEvery) Next(t time.Time) time.Time {
	if t.Before(a.start) {
		return a.start
	}
	return a.start.Add((t.Sub(a.start)/a.every + 1) * a.every)
}

// notBefore is a schedule's ticks from start on.
type notBefore struct {
	cron.Schedule
	start time.Time
}

func (n notBefore) Next(t time.Time) time.Time {
	if t.Before(n.start) {
		t = n.start.Add(-time.Nanosecond)
	}
	return n.Schedule.Next(t)
}

// Validate checks a trigger as a client sends it.
func (t *Trigger) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidTrigger, field, fmt.Sprintf(format, args...))
	}
	if t.Name == "" || len(t.Name) > 63 || !isLabel(t.Name) {
		return bad("name", "%q: a trigger name is 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit", t.Name)
	}
	if t.Namespace != "" && !ValidNamespace(t.Namespace) {
		return bad("namespace", "%q: not a namespace name", t.Namespace)
	}
	if t.Function == "" {
		return bad("function", "required")
	}
	if t.Path != "" && (!strings.HasPrefix(t.Path, "/") || len(t.Path) > 1024 || strings.ContainsAny(t.Path, " ?#\r\n")) {
		return bad("path", "%q: want an absolute path without query (at most 1024 bytes)", t.Path)
	}
	if len(t.Headers) > 32 {
		return bad("headers", "%d, at most 32", len(t.Headers))
	}
	for k, v := range t.Headers {
		if !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") || len(k)+len(v) > 4096 {
			return bad("headers", "%q: not a valid header", k)
		}
		switch http.CanonicalHeaderKey(k) {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Upgrade", "Te", "Trailer", "Keep-Alive", "Proxy-Connection",
			"Authorization", "X-Call-Id", "X-Callback-Url", "Prefer":
			return bad("headers", "%q: brisk sets it, or it is not the trigger's to set", k)
		}
	}
	if t.Managed != "" && t.Managed != ManagedByAnnotations {
		return bad("managed", "%q: only %q (set by brisk)", t.Managed, ManagedByAnnotations)
	}
	switch {
	case t.Cron != nil && t.NATS != nil:
		return bad("source", "set cron or nats, not both")
	case t.Cron != nil:
		c := t.Cron
		if _, err := ParseSchedule(c); err != nil {
			return bad("cron", "%v", err)
		}
		if len(c.Payload) > MaxTriggerPayload {
			return bad("cron.payload", "%d bytes, above the limit %d", len(c.Payload), MaxTriggerPayload)
		}
		if strings.ContainsAny(c.ContentType, "\r\n") || len(c.ContentType) > 256 {
			return bad("cron.content_type", "%q: not a media type", c.ContentType)
		}
		if c.CatchUp != "" && c.CatchUp != CatchUpOnce && c.CatchUp != CatchUpSkip {
			return bad("cron.catch_up", "%q: want %q or %q", c.CatchUp, CatchUpOnce, CatchUpSkip)
		}
	case t.NATS != nil:
		n := t.NATS
		if err := validSubject(n.Subject); err != nil {
			return bad("nats.subject", "%v", err)
		}
		if n.URL == "" {
			ns := TriggerNamespace(t)
			if ns == "brisk" {
				return bad("namespace", "the subjects brisk.> of the cluster's NATS are brisk's own: namespace brisk's triggers need an external NATS (url)")
			}
			if !strings.HasPrefix(n.Subject, ns+".") {
				return bad("nats.subject", "%q: on the cluster's NATS a trigger's subject lies under its namespace: %s.SUBJECT (e.g. %s.orders.>)", n.Subject, ns, ns)
			}
			if n.CredentialsSecret != "" {
				return bad("nats.credentials_secret", "credentials are for an external server (url); the cluster's NATS needs none")
			}
		} else if err := validNATSURL(n.URL); err != nil {
			return bad("nats.url", "%v", err)
		}
		if n.CredentialsSecret != "" && !ValidSecretName(n.CredentialsSecret) {
			return bad("nats.credentials_secret", "%q: %s", n.CredentialsSecret, SecretNameRule)
		}
		if n.Stream != "" {
			if len(n.Stream) > 255 || strings.ContainsAny(n.Stream, ".*> \t\r\n/\\") {
				return bad("nats.stream", "%q: a JetStream stream name has no '.', '*', '>', '/', '\\' or white space", n.Stream)
			}
			if n.URL == "" && (strings.HasPrefix(n.Stream, "BRISK_") || strings.HasPrefix(n.Stream, "KV_")) {
				return bad("nats.stream", "%q: streams BRISK_* and KV_* of the cluster's NATS are brisk's own", n.Stream)
			}
		}
	default:
		return bad("source", "set cron (a schedule) or nats (a subject)")
	}
	return nil
}

func validHeaderName(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ManagedByAnnotations marks a trigger made from its function's
// annotations (AnnotationTriggers).
const ManagedByAnnotations = "annotations"

// OpenFaaS connector annotations.
const (
	AnnotationTopic    = "topic"
	AnnotationSchedule = "schedule"
	CronTopic          = "cron-function"
)

// AnnotationTriggers are the triggers f's OpenFaaS connector annotations
// ask for, as OpenFaaS's cron and NATS connectors read them: topic
// "cron-function" with "schedule" makes a cron trigger NAME-cron; every
// other topic (comma-separated) a NATS trigger NAME-topic-TOPIC on the
// cluster's NATS, subject NAMESPACE.TOPIC (subjects lie under their
// namespace there). The connectors call with POST and, for NATS, the
// message as the body.
func AnnotationTriggers(f *Function) ([]Trigger, error) {
	topics := f.Annotations[AnnotationTopic]
	sched, hasSched := f.Annotations[AnnotationSchedule]
	if topics == "" {
		if hasSched {
			return nil, fmt.Errorf("%w: annotations: schedule %q without topic: cron-function (OpenFaaS's cron connector reads both)", ErrInvalid, sched)
		}
		return nil, nil
	}
	ns := NamespaceOf(f)
	var out []Trigger
	seen := map[string]bool{}
	for topic := range strings.SplitSeq(topics, ",") {
		topic = strings.TrimSpace(topic)
		if topic == "" || seen[topic] {
			continue
		}
		seen[topic] = true
		t := Trigger{Namespace: ns, Function: f.Name, Managed: ManagedByAnnotations}
		if topic == CronTopic {
			if !hasSched {
				return nil, fmt.Errorf("%w: annotations: topic cron-function needs a schedule annotation (e.g. \"*/5 * * * *\")", ErrInvalid)
			}
			t.Name = managedName(f.Name, "cron")
			t.Cron = &CronSource{Schedule: sched}
		} else {
			t.Name = managedName(f.Name, "topic-"+topic)
			t.NATS = &NATSSource{Subject: ns + "." + topic}
		}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("%w: annotations: topic %q: %v", ErrInvalid, topic, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// managedName is a trigger name made of a function's and a suffix: a DNS
// label, shortened with a hash when too long.
func managedName(fn, suffix string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(fn + "-" + suffix) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), "-")
	if len(s) > 63 {
		h := fnv.New32a()
		h.Write([]byte(s))
		s = strings.TrimRight(s[:54], "-") + fmt.Sprintf("-%08x", h.Sum32())
	}
	return s
}

// validSubject checks a NATS subject a trigger subscribes to.
func validSubject(s string) error {
	if s == "" {
		return errors.New("required")
	}
	if len(s) > 256 {
		return fmt.Errorf("%q: longer than 256 bytes", s)
	}
	toks := strings.Split(s, ".")
	for i, tok := range toks {
		switch {
		case tok == "":
			return fmt.Errorf("%q: empty token (a subject is tokens separated by '.')", s)
		case strings.ContainsAny(tok, " \t\r\n"):
			return fmt.Errorf("%q: white space", s)
		case tok == ">" && i != len(toks)-1:
			return fmt.Errorf("%q: '>' only as the last token", s)
		case tok != ">" && tok != "*" && strings.ContainsAny(tok, "*>"):
			return fmt.Errorf("%q: a wildcard is a whole token", s)
		}
	}
	if strings.HasPrefix(s, "$") || strings.HasPrefix(s, "_INBOX") {
		return fmt.Errorf("%q: $... and _INBOX... subjects are the server's own", s)
	}
	return nil
}

// validNATSURL checks an external server's address list.
func validNATSURL(s string) error {
	if len(s) > 2048 {
		return errors.New("longer than 2048 bytes")
	}
	for part := range strings.SplitSeq(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") || u.Path != "" && u.Path != "/" || u.RawQuery != "" {
			return fmt.Errorf("%q: want nats://host:port or tls://host:port", part)
		}
		if u.User != nil {
			return fmt.Errorf("%q: put credentials in a secret (credentials_secret), not in the URL", part)
		}
	}
	return nil
}
