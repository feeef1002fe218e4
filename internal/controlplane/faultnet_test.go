package controlplane

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// faultNet is a lossy link between the control plane and its workers, under
// the test's control. It is installed through the product's extension hooks:
// Config.WorkerLinkInterceptor wraps the control plane's end of every
// Worker.Session stream and worker.Config.SessionInterceptor the worker's end.
//
// The worker's end sees every message of a session in both directions (a
// Commands batch with both Creates and Tombstones counts as two, see split).
// A rule decides, per message, to pass, drop or duplicate it, to hold it until
// the test releases it (delay; releasing it after later messages reorders),
// or to cut the session before or after it. A cut cancels the control
// plane's end of the stream, as a broken connection does; both ends see the
// stream fail. A ToWorker message the worker's transport had already received
// when the session was cut (a held one) can still be released to the old
// session's handler afterwards: that is how a message of an old session
// arrives late, after a newer handshake. A partitioned node refuses new
// sessions at both ends until it is healed.
//
// The rule runs on the gRPC goroutines of the session; it must not block.
type faultNet struct {
	mu   sync.Mutex
	cond *sync.Cond // broadcast whenever a stream's queue, a hold or closed changes

	ruleMu sync.Mutex
	rule   rule

	parts   map[string]bool
	cancels map[string]context.CancelFunc // node -> cancel of the control plane's end of its newest stream
	byEpoch map[uint64]context.CancelFunc // session epoch -> the same, for cutting one given session
	current map[string]*wstream           // node -> worker end of the newest stream that got a Hello
	held    []*heldMsg
	seen    []seenMsg // every message the worker's end saw, in order
	closed  bool
}

type msgDir int

const (
	toWorker msgDir = iota
	fromWorker
)

type verdict int

const (
	pass      verdict = iota
	drop              // lose the message
	dup               // deliver it twice
	hold              // keep it until release
	cutBefore         // lose it and cut the session
	cutAfter          // deliver it, then cut the session
)

// rule decides the fate of one message of node's session. Messages are
// *briskv1.ToWorker or *briskv1.FromWorker.
type rule func(node string, d msgDir, m proto.Message) verdict

type heldMsg struct {
	s   *wstream
	dir msgDir
	msg proto.Message
}

// seenMsg is one message as the worker's end of a session saw it, before the
// rule acted on it.
type seenMsg struct {
	node    string
	dir     msgDir
	msg     proto.Message
	verdict verdict
	stream  *wstream
}

func newFaultNet() *faultNet {
	f := &faultNet{
		parts: make(map[string]bool), cancels: make(map[string]context.CancelFunc), byEpoch: make(map[uint64]context.CancelFunc),
		current: make(map[string]*wstream),
	}
	f.cond = sync.NewCond(&f.mu)
	return f
}

// setRule installs r for every later message; nil passes everything.
func (f *faultNet) setRule(r rule) {
	f.ruleMu.Lock()
	f.rule = r
	f.ruleMu.Unlock()
}

func (f *faultNet) judge(node string, d msgDir, m proto.Message) verdict {
	f.ruleMu.Lock()
	defer f.ruleMu.Unlock()
	if f.rule == nil {
		return pass
	}
	return f.rule(node, d, m)
}

// cut breaks node's current session, as a dropped connection would.
func (f *faultNet) cut(node string) {
	f.mu.Lock()
	cancel := f.cancels[node]
	f.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// partition cuts node's session and refuses new ones until heal.
func (f *faultNet) partition(node string) {
	f.mu.Lock()
	f.parts[node] = true
	f.mu.Unlock()
	f.cut(node)
}

func (f *faultNet) heal(node string) {
	f.mu.Lock()
	delete(f.parts, node)
	f.mu.Unlock()
}

func (f *faultNet) partitioned(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.parts[node]
}

// close discards every held message and unblocks every stream, so that the
// components can stop.
func (f *faultNet) close() {
	f.mu.Lock()
	f.closed = true
	f.held = nil
	f.cond.Broadcast()
	f.mu.Unlock()
}

// heldCount counts held messages that match pred (nil: all).
func (f *faultNet) heldCount(pred func(*heldMsg) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, h := range f.held {
		if pred == nil || pred(h) {
			n++
		}
	}
	return n
}

// release delivers the held messages that match pred (nil: all), in the
// order they were held: a ToWorker message to the handler of the session
// that received it (even if that session has been cut since), a FromWorker
// message on the stream it was sent on (lost if that stream has ended).
func (f *faultNet) release(pred func(*heldMsg) bool) int {
	f.mu.Lock()
	var out, keep []*heldMsg
	for _, h := range f.held {
		if pred == nil || pred(h) {
			out = append(out, h)
		} else {
			keep = append(keep, h)
		}
	}
	f.held = keep
	for _, h := range out {
		if h.dir == toWorker {
			h.s.queue = append(h.s.queue, h.msg.(*briskv1.ToWorker))
		}
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	for _, h := range out {
		if h.dir == fromWorker {
			_ = h.s.send(h.msg)
		}
	}
	return len(out)
}

// stream returns the worker's end of node's newest session (nil before the
// first Hello).
func (f *faultNet) stream(node string) *wstream {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current[node]
}

// injectToWorker hands m to the handler of node's newest session, as if the
// control plane had sent it.
func (f *faultNet) injectToWorker(node string, m *briskv1.ToWorker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.current[node]
	s.queue = append(s.queue, m)
	f.cond.Broadcast()
}

// injectFromWorker sends m to the control plane on node's newest session,
// as if the worker had sent it.
func (f *faultNet) injectFromWorker(node string, m *briskv1.FromWorker) error {
	return f.stream(node).send(m)
}

// seenWhere returns the messages seen so far that match pred.
func (f *faultNet) seenWhere(pred func(seenMsg) bool) []seenMsg {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []seenMsg
	for _, s := range f.seen {
		if pred(s) {
			out = append(out, s)
		}
	}
	return out
}

func (f *faultNet) note(s *wstream, d msgDir, m proto.Message, v verdict) {
	f.mu.Lock()
	f.seen = append(f.seen, seenMsg{node: s.node, dir: d, msg: proto.Clone(m), verdict: v, stream: s})
	f.mu.Unlock()
}

func nodeOf(md metadata.MD) string {
	if v := md.Get("brisk-node"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// clientInterceptor is the control plane's end: it refuses sessions to
// partitioned nodes and makes each session cuttable.
func (f *faultNet) clientInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method != briskv1.Worker_Session_FullMethodName {
		return streamer(ctx, desc, cc, method, opts...)
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	node := nodeOf(md)
	if f.partitioned(node) {
		return nil, status.Error(codes.Unavailable, "faultnet: partitioned")
	}
	ctx, cancel := context.WithCancel(ctx)
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	f.mu.Lock()
	f.cancels[node] = cancel
	f.mu.Unlock()
	return &cstream{ClientStream: cs, f: f, cancel: cancel}, nil
}

// cstream is the control plane's end of one session; it notes the session's
// epoch so that the worker's end can cut exactly this session.
type cstream struct {
	grpc.ClientStream
	f      *faultNet
	cancel context.CancelFunc
}

func (c *cstream) SendMsg(m any) error {
	if h := m.(*briskv1.ToWorker).GetHello(); h != nil {
		c.f.mu.Lock()
		c.f.byEpoch[h.GetEpoch()] = c.cancel
		c.f.mu.Unlock()
	}
	return c.ClientStream.SendMsg(m)
}

// cutSession breaks the session with this epoch (whatever is newer survives).
func (f *faultNet) cutSession(epoch uint64) {
	f.mu.Lock()
	cancel := f.byEpoch[epoch]
	f.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// serverInterceptor is the worker's end: every message passes the rule.
func (f *faultNet) serverInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	node := nodeOf(md)
	if f.partitioned(node) {
		return status.Error(codes.Unavailable, "faultnet: partitioned")
	}
	s := &wstream{ServerStream: ss, f: f, node: node, done: make(chan struct{})}
	go s.pump()
	err := handler(srv, s)
	s.sendMu.Lock()
	s.ended = true
	s.sendMu.Unlock()
	close(s.done)
	return err
}

// wstream is the worker's end of one session. A pump goroutine reads the
// real stream so that held messages can be released while the handler waits.
type wstream struct {
	grpc.ServerStream
	f    *faultNet
	node string
	done chan struct{} // closed when the worker's handler has returned

	// guarded by f.mu
	queue []*briskv1.ToWorker // ready for the handler
	err   error               // the real stream's receive error
	epoch uint64              // from the session's Hello

	sendMu sync.Mutex
	ended  bool
}

// Epoch is the session's epoch (0 before its Hello).
func (s *wstream) Epoch() uint64 {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return s.epoch
}

// finished reports whether the worker's handler for this session has
// returned.
func (s *wstream) finished() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *wstream) pump() {
	f := s.f
	for {
		m := new(briskv1.ToWorker)
		if err := s.ServerStream.RecvMsg(m); err != nil {
			f.mu.Lock()
			s.err = err
			f.cond.Broadcast()
			f.mu.Unlock()
			return
		}
		if h := m.GetHello(); h != nil {
			f.mu.Lock()
			s.epoch = h.GetEpoch()
			f.current[s.node] = s
			f.mu.Unlock()
		}
		for _, part := range split(m) {
			s.judge(part)
		}
	}
}

// split cuts a Commands batch that carries both Creates and Tombstones into
// two messages, the Creates (with the specs) first, so that a rule can treat
// them apart. The worker applies a batch's Creates before its Tombstones, so
// the pair means what the batch meant.
func split(m *briskv1.ToWorker) []*briskv1.ToWorker {
	c := m.GetCommands()
	if c == nil || len(c.GetTombstones()) == 0 || len(c.GetCreates())+len(c.GetSpecs()) == 0 {
		return []*briskv1.ToWorker{m}
	}
	return []*briskv1.ToWorker{
		{Epoch: m.GetEpoch(), Msg: &briskv1.ToWorker_Commands{Commands: &briskv1.Commands{Specs: c.GetSpecs(), Creates: c.GetCreates()}}},
		{Epoch: m.GetEpoch(), Msg: &briskv1.ToWorker_Commands{Commands: &briskv1.Commands{Tombstones: c.GetTombstones()}}},
	}
}

func (s *wstream) judge(m *briskv1.ToWorker) {
	f := s.f
	v := f.judge(s.node, toWorker, m)
	f.note(s, toWorker, m, v)
	f.mu.Lock()
	switch v {
	case pass, cutAfter:
		s.queue = append(s.queue, m)
	case dup:
		s.queue = append(s.queue, m, proto.Clone(m).(*briskv1.ToWorker))
	case hold:
		f.held = append(f.held, &heldMsg{s: s, dir: toWorker, msg: m})
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	if v == cutBefore || v == cutAfter {
		f.cutSession(s.Epoch())
	}
}

// RecvMsg hands the handler the next deliverable message. Once the real
// stream has failed it still waits for this session's held messages, so a
// test can deliver them late.
func (s *wstream) RecvMsg(m any) error {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		if len(s.queue) > 0 {
			next := s.queue[0]
			s.queue = s.queue[1:]
			proto.Merge(m.(proto.Message), next)
			return nil
		}
		if s.err != nil && (f.closed || !s.holdsLocked()) {
			return s.err
		}
		if f.closed && s.err == nil {
			return status.Error(codes.Unavailable, "faultnet: closed")
		}
		f.cond.Wait()
	}
}

func (s *wstream) holdsLocked() bool {
	for _, h := range s.f.held {
		if h.s == s && h.dir == toWorker {
			return true
		}
	}
	return false
}

func (s *wstream) SendMsg(m any) error {
	msg := m.(*briskv1.FromWorker)
	v := s.f.judge(s.node, fromWorker, msg)
	s.f.note(s, fromWorker, msg, v)
	switch v {
	case drop:
		return nil
	case dup:
		if err := s.send(msg); err != nil {
			return err
		}
		return s.send(proto.Clone(msg))
	case hold:
		s.f.mu.Lock()
		s.f.held = append(s.f.held, &heldMsg{s: s, dir: fromWorker, msg: proto.Clone(msg)})
		s.f.mu.Unlock()
		return nil
	case cutBefore:
		s.f.cutSession(s.Epoch())
		return status.Error(codes.Unavailable, "faultnet: cut")
	case cutAfter:
		err := s.send(msg)
		s.f.cutSession(s.Epoch())
		return err
	}
	return s.send(msg)
}

// send writes on the real stream unless the handler has returned (gRPC
// forbids sending then).
func (s *wstream) send(m proto.Message) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.ended {
		return status.Error(codes.Unavailable, "faultnet: stream ended")
	}
	return s.ServerStream.SendMsg(m)
}
