package async

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// JetStream names.
const (
	CallsStream  = "BRISK_CALLS"
	DeadStream   = "BRISK_DEAD"
	StatusBucket = "BRISK_CALL_STATUS"
	consumerName = "brisk-dispatch"
	callsPrefix  = "brisk.calls."
	deadPrefix   = "brisk.dead."
	hdrCall      = "Brisk-Call"
	// kvPrefix is the subject of the status bucket's keys.
	kvPrefix = "$KV." + StatusBucket + "."
)

// Errors Submit and the lookups return.
var (
	ErrQueueFull = errors.New("async queue is at its limit")
	// ErrNamespaceFull: the call's namespace holds its share of the queue
	// (Config.NamespaceShare).
	ErrNamespaceFull = errors.New("the namespace holds its share of the async queue")
	ErrNotFound      = errors.New("no such call")
	ErrTooLarge      = errors.New("call too large for the queue")
	ErrBadID         = errors.New("call id must be 1-64 letters, digits, '-' or '_'")
	// ErrIDTaken: the id names a call of another function (while its
	// record lives).
	ErrIDTaken = errors.New("call id in use by another function's call")
)

// Config configures a Queue. Zero fields take the defaults below.
type Config struct {
	// Replicas of each stream and the status bucket: 1 on one server, 3 on
	// a NATS cluster (docs/operations.md).
	Replicas int
	// MaxQueued and MaxQueuedBytes bound the calls waiting at once; a
	// submit past either is refused (503) before it is accepted.
	MaxQueued      int64
	MaxQueuedBytes int64
	// ResultTTL is how long a call's status record and result are kept
	// after its last change; DeadTTL how long a dead letter is kept.
	ResultTTL time.Duration
	DeadTTL   time.Duration
	// AckWait is how long a delivered call may go without a sign of life
	// before JetStream delivers it again (a consumer that died). Running
	// calls send one every AckWait/3, so a long call is not re-delivered.
	AckWait time.Duration
	// YieldFloor is how many attempts a consumer keeps running while its
	// data plane is busy accepting submits (yield.go); 0: GOMAXPROCS.
	YieldFloor int
	// MaxInFlight bounds the calls one consumer holds at once.
	MaxInFlight int
	// MaxResultBytes bounds the body kept in a status record (and posted
	// to a callback); longer bodies are cut and marked truncated.
	MaxResultBytes int
	// NamespaceShare is the part of MaxQueued and MaxQueuedBytes one
	// namespace's waiting calls may hold (shares.go); 1: no share.
	NamespaceShare float64
	// NamespaceResultBytes bounds the result bodies above 4 KiB one
	// namespace's calls keep at once; past it the oldest are dropped
	// (results.go).
	NamespaceResultBytes int64
	// CallbackAllow lists address ranges callbacks may reach beyond the
	// default, public addresses: loopback, private, carrier-grade NAT,
	// link-local, unspecified and multicast addresses (and NAT64 forms of
	// refused IPv4 addresses) are refused unless listed here (a callback
	// is a request the platform makes on a caller's behalf).
	CallbackAllow []netip.Prefix
	// CallbackAttempts and CallbackTimeout: each callback is tried this
	// many times (back-off 1 s, 2 s, ...), each try within the timeout.
	CallbackAttempts int
	CallbackTimeout  time.Duration

	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Defaults.
const (
	DefaultMaxQueued        = 1_000_000
	DefaultMaxQueuedBytes   = 4 << 30
	DefaultResultTTL        = 24 * time.Hour
	DefaultDeadTTL          = 7 * 24 * time.Hour
	DefaultAckWait          = 10 * time.Second
	DefaultMaxInFlight      = 1024
	DefaultMaxResultBytes   = 1 << 20
	DefaultNamespaceResults = 256 << 20
	DefaultNamespaceShare   = 0.5
	DefaultCallbackAttempts = 5
	DefaultCallbackTimeout  = 10 * time.Second
)

func (c Config) withDefaults() Config {
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	def(&c.MaxQueued, DefaultMaxQueued)
	def(&c.MaxQueuedBytes, DefaultMaxQueuedBytes)
	def(&c.NamespaceResultBytes, DefaultNamespaceResults)
	if c.NamespaceShare <= 0 {
		c.NamespaceShare = DefaultNamespaceShare
	}
	if c.ResultTTL == 0 {
		c.ResultTTL = DefaultResultTTL
	}
	if c.DeadTTL == 0 {
		c.DeadTTL = DefaultDeadTTL
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = DefaultMaxResultBytes
	}
	if c.CallbackAttempts == 0 {
		c.CallbackAttempts = DefaultCallbackAttempts
	}
	if c.CallbackTimeout == 0 {
		c.CallbackTimeout = DefaultCallbackTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Queue is the async queue as one process sees it: submit, look up, retry,
// purge, and (Run) consume.
type Queue struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	calls   jetstream.Stream
	dead    jetstream.Stream
	status  jetstream.KeyValue
	cons    jetstream.Consumer
	m       *metrics
	results resultStreams
	shares  shares
	hc      *http.Client // callbacks
	now     func() time.Time
	yield   *yielder
}

// Open creates or updates the streams, the status bucket and the shared
// consumer, and returns a Queue using nc.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Queue, error) {
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("async: %w", err)
	}
	q := &Queue{cfg: cfg, nc: nc, js: js, now: time.Now, yield: newYielder(cfg.YieldFloor)}
	q.calls, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        CallsStream,
		Description: "brisk: asynchronous calls waiting or running",
		Subjects:    []string{callsPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxMsgs:     cfg.MaxQueued,
		MaxBytes:    cfg.MaxQueuedBytes,
		Discard:     jetstream.DiscardNew,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("async: stream %s: %w", CallsStream, err)
	}
	q.dead, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        DeadStream,
		Description: "brisk: asynchronous calls that failed for good",
		Subjects:    []string{deadPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.DeadTTL,
		MaxBytes:    cfg.MaxQueuedBytes,
		Discard:     jetstream.DiscardOld,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("async: stream %s: %w", DeadStream, err)
	}
	q.status, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      StatusBucket,
		Description: "brisk: asynchronous call status and results",
		History:     1,
		TTL:         cfg.ResultTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("async: bucket %s: %w", StatusBucket, err)
	}
	q.cons, err = q.calls.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       consumerName,
		Description:   "brisk data planes deliver asynchronous calls",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    -1, // attempts are counted against the function's policy
		MaxAckPending: 100_000,
		FilterSubject: callsPrefix + ">",
	})
	if err != nil {
		return nil, fmt.Errorf("async: consumer: %w", err)
	}
	q.m, err = newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	q.hc = newCallbackClient(cfg.CallbackAllow, cfg.CallbackTimeout)
	// The namespaces' shares start from what waits now (a restarted data
	// plane's queue may hold calls), not from a first submit's reading.
	if depth, err := q.Depth(ctx); err == nil {
		q.refreshShares(depth, nil)
	}
	return q, nil
}

// MaxBody is the largest request body a call may carry: the NATS server's
// payload limit less room for the request head.
func (q *Queue) MaxBody() int64 {
	return q.nc.MaxPayload() - 64<<10
}

// metaBufs holds the buffers call heads are encoded in.
var metaBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// headRoom is kept free in a stored call's message beyond its head and
// body: the other header lines, and a dead letter's reason.
const headRoom = 4 << 10

// Call is one asynchronous invocation as stored in the queue.
type Call struct {
	ID       string
	Function string
	Method   string
	Path     string // what the function sees, escaped (URL.EscapedPath form)
	Query    string // raw query, without '?'
	Header   http.Header
	Body     []byte
	// Host and Remote are the submitting request's Host and client
	// address, for the X-Forwarded-* headers the function sees.
	Host   string
	Remote string
	// CallbackURL, when set, receives the result (X-Callback-Url).
	CallbackURL string
	Submitted   time.Time
	// Fresh says the id was made by the submitting data plane (random,
	// never a client's): no other call can hold it, so Submit need not
	// claim it before storing the call, and the two writes go together.
	Fresh bool
	// Dedupe, with Fresh, marks an id of the platform's own that may be
	// submitted again (a trigger's message redelivered after a crash):
	// JetStream stores it once within its duplicate window (two minutes),
	// still without a status record before the call's attempt.
	Dedupe bool
	// FunctionUID is the identity of the function it was submitted to
	// (spec.Function.UID): never delivered to, nor shown for, a function
	// made later under the same name. Empty for calls from before uids.
	FunctionUID string
}

// callMeta is a Call's head as stored in the Brisk-Call header.
type callMeta struct {
	Method   string      `json:"m"`
	Path     string      `json:"p"`
	Query    string      `json:"q,omitempty"`
	Header   http.Header `json:"h,omitempty"`
	Callback string      `json:"cb,omitempty"`
	Submit   int64       `json:"t"`
	Host     string      `json:"host,omitempty"`
	Remote   string      `json:"ra,omitempty"`
	UID      string      `json:"u,omitempty"`
}

// TriggerIDPrefix starts the id of every call a trigger makes
// (internal/trigger); data planes refuse it from clients, so that no client
// can take a trigger's id first.
const TriggerIDPrefix = "trigger-"

// ValidID reports whether id may name a call: it becomes a NATS subject
// token and a key.
func ValidID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Submit stores c durably: when it returns nil, JetStream has the call and
// it will run at least once. A call id submitted twice within two minutes
// is stored once (a client retrying its submit does not run it twice).
func (q *Queue) Submit(ctx context.Context, c *Call) error {
	if !ValidID(c.ID) {
		return ErrBadID
	}
	if int64(len(c.Body)) > q.MaxBody() {
		return ErrTooLarge
	}
	if c.Submitted.IsZero() {
		c.Submitted = q.now()
	}
	bp := metaBufs.Get().(*[]byte)
	*bp = (&callMeta{Method: c.Method, Path: c.Path, Query: c.Query, Header: c.Header, Callback: c.CallbackURL, Submit: c.Submitted.UnixNano(), Host: c.Host, Remote: c.Remote, UID: c.FunctionUID}).appendJSON((*bp)[:0])
	meta := string(*bp)
	metaBufs.Put(bp)
	// The head counts against the payload limit too (headers escaped in
	// JSON grow), with room for the dead letter's reason: a call stored
	// at the limit must still fit in the dead-letter stream.
	if int64(len(meta)+len(c.Body))+headRoom > q.nc.MaxPayload() {
		return ErrTooLarge
	}
	ok, share := q.admitShare(NamespaceOfFunction(c.Function), len(meta)+len(c.Body))
	if !ok {
		return ErrNamespaceFull
	}
	msg := &nats.Msg{Subject: subject(callsPrefix, c.Function, c.ID), Header: nats.Header{hdrCall: {meta}}, Data: c.Body}
	if c.Fresh {
		// An id nobody else can hold: one JetStream write, the call alone.
		// Its queued state is the call's presence in the calls stream (Get
		// and List read it there); the consumer writes the first record,
		// at its attempt's end (or when it outlasts runningAfter). No
		// Nats-Msg-Id unless asked: a data plane's id never comes twice,
		// and JetStream's duplicate window need not remember it.
		if c.Dedupe {
			msg.Header[jetstream.MsgIDHeader] = []string{c.ID}
		}
		return q.store(ctx, c, msg, share)
	}
	// A client's id may come again (a retried submit): JetStream stores
	// it once within its duplicate window.
	msg.Header[jetstream.MsgIDHeader] = []string{c.ID}
	// The queued record goes first and only where none exists, so that it
	// can neither overwrite a later state nor be missing when the
	// consumer writes one. It claims the id: an id whose record names
	// another function is refused, not de-duplicated away or run over
	// that call's record.
	rec, err := json.Marshal(&Record{ID: c.ID, Function: c.Function, FunctionUID: c.FunctionUID, Status: StatusQueued, SubmittedAt: c.Submitted, CallbackURL: c.CallbackURL})
	if err != nil {
		return err
	}
	rev, err := q.status.Create(ctx, c.ID, rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		r, err := q.Get(ctx, c.ID)
		if err == nil && r.Function != c.Function {
			return ErrIDTaken
		}
		if err == nil && r.Status != StatusQueued {
			return nil // the same call again (running or finished): submits are idempotent by id
		}
		rev = 0 // a client retrying its submit: the record is not ours
	case err != nil:
		return fmt.Errorf("async: store call: %w", err)
	default:
		// A call stored with a data-plane id has no record until its
		// attempt: the calls stream says whether the id is taken.
		m, gerr := q.calls.GetLastMsgForSubject(ctx, callsPrefix+"*."+c.ID)
		if gerr == nil || !errors.Is(gerr, jetstream.ErrMsgNotFound) {
			_ = q.status.Delete(context.WithoutCancel(ctx), c.ID, jetstream.LastRevision(rev))
		}
		switch {
		case gerr == nil:
			if fn, _, _ := splitSubject(m.Subject); fn != c.Function {
				return ErrIDTaken
			}
			return nil // the same call, queued already
		case !errors.Is(gerr, jetstream.ErrMsgNotFound):
			return fmt.Errorf("async: store call: %w", gerr)
		}
	}
	err = q.store(ctx, c, msg, share)
	if err != nil && rev != 0 {
		// A refused call leaves no record saying it is queued.
		_ = q.status.Delete(context.WithoutCancel(ctx), c.ID, jetstream.LastRevision(rev))
	}
	return err
}

// Accepting marks a submit in progress on this data plane, from its
// request's arrival; the returned func marks its end. While several are,
// the consumer yields (yield.go).
func (q *Queue) Accepting() (done func()) { return q.yield.accepting() }

// store publishes call c's message and counts it accepted.
func (q *Queue) store(ctx context.Context, c *Call, msg *nats.Msg, share *nsShare) error {
	if err := q.publish(ctx, msg); err != nil {
		if isLimit(err) {
			return ErrQueueFull
		}
		return fmt.Errorf("async: store call: %w", err)
	}
	if share != nil {
		share.added.Add(1)
	}
	q.m.accepted.WithLabelValues(c.Function).Inc()
	return nil
}

func isLimit(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		s := strings.ToLower(apiErr.Description)
		return strings.Contains(s, "maximum messages") || strings.Contains(s, "maximum bytes") || strings.Contains(s, "resource limits")
	}
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "maximum messages") || strings.Contains(s, "maximum bytes")
}

// decodeCall rebuilds a Call from a stored message.
func decodeCall(subject string, h nats.Header, data []byte) (*Call, error) {
	fn, id, ok := splitSubject(subject)
	if !ok {
		return nil, fmt.Errorf("async: malformed subject %q", subject)
	}
	var m callMeta
	if err := json.Unmarshal([]byte(h.Get(hdrCall)), &m); err != nil {
		return nil, fmt.Errorf("async: call %s: malformed head: %w", id, err)
	}
	return &Call{ID: id, Function: fn, Method: m.Method, Path: m.Path, Query: m.Query, Header: m.Header,
		Body: data, CallbackURL: m.Callback, Submitted: time.Unix(0, m.Submit), Host: m.Host, Remote: m.Remote, FunctionUID: m.UID}, nil
}

// subject is the subject of call id of function fn under prefix:
// prefix FN.ID, FN being fn as one subject token (fnToken).
func subject(prefix, fn, id string) string { return prefix + fnToken(fn) + "." + id }

// fnToken is function fn as one subject token: the dot of NAME.NAMESPACE
// (spec.Qualify) becomes ':', which no name has, so that every subject is
// PREFIX FN.ID and "*."+ID finds a call of any function in one lookup.
// Names without a dot, most, are used as they are, without allocating.
func fnToken(fn string) string { return strings.ReplaceAll(fn, ".", ":") }

// ValidFunction reports whether fn may name a function in subjects: NAME
// or NAME.NAMESPACE, each a valid id.
func ValidFunction(fn string) bool {
	name, ns, ok := strings.Cut(fn, ".")
	return ValidID(name) && (!ok || ValidID(ns))
}

// splitSubject parses brisk.calls.FN.ID or brisk.dead.FN.ID (FN a
// fnToken) into the function's name and the call's id.
func splitSubject(s string) (fn, id string, ok bool) {
	rest, found := strings.CutPrefix(s, callsPrefix)
	if !found {
		if rest, found = strings.CutPrefix(s, deadPrefix); !found {
			return "", "", false
		}
	}
	tok, id, ok := strings.Cut(rest, ".")
	if !ok || tok == "" || id == "" {
		return "", "", false
	}
	return strings.ReplaceAll(tok, ":", "."), id, true
}

// Conn is the NATS connection the queue uses (triggers subscribe on it).
func (q *Queue) Conn() *nats.Conn { return q.nc }
