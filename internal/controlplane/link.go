package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/internal/specpb"
	"github.com/brisk-faas/brisk/pkg/spec"
)

type specKey struct {
	name string
	rev  uint64
}

// session is the control plane's end of one live link session with a worker:
// an outbox of commands that a sender goroutine flushes in batches.
type session struct {
	epoch   uint64
	mu      sync.Mutex
	specs   []*briskv1.FunctionSpec
	creates []*briskv1.CreateSandbox
	tombs   []string
	verify  []string
	egress  *briskv1.EgressPolicies // the namespaces' egress policies, when they are to be sent
	// sent holds the specs this worker has been sent in this session, with
	// the secret generation their values were taken from.
	sent   map[specKey]uint64
	notify chan struct{}
}

func newSession(epoch uint64) *session {
	return &session{epoch: epoch, sent: make(map[specKey]uint64), notify: make(chan struct{}, 1)}
}

func (s *session) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// create queues a Create, preceded by the function spec the first time this
// session needs it (or again, when the secret values it carried changed).
func (s *session) create(f *spec.Function, id string, secrets map[string][]byte, gen uint64) {
	s.mu.Lock()
	s.queueSpecLocked(f, secrets, gen)
	s.creates = append(s.creates, &briskv1.CreateSandbox{Id: id, Function: f.Name, Revision: f.Revision})
	s.mu.Unlock()
	s.signal()
}

// offer queues f's spec alone, once per session: a worker serves
// emergency calls only for functions the control plane offered it.
func (s *session) offer(f *spec.Function, secrets map[string][]byte, gen uint64) {
	s.mu.Lock()
	queued := s.queueSpecLocked(f, secrets, gen)
	s.mu.Unlock()
	if queued {
		s.signal()
	}
}

// queueSpecLocked queues f's spec, with the values of its secrets, unless
// this session already sent it with values of generation gen.
func (s *session) queueSpecLocked(f *spec.Function, secrets map[string][]byte, gen uint64) bool {
	k := specKey{f.Name, f.Revision}
	if g, ok := s.sent[k]; ok && g == gen {
		return false
	}
	s.sent[k] = gen
	p := specpb.ToProto(f)
	p.SecretData = secrets
	s.specs = append(s.specs, p)
	return true
}

// setEgress queues the namespaces' egress policies (the complete set),
// replacing any not yet sent.
func (s *session) setEgress(e *briskv1.EgressPolicies) {
	s.mu.Lock()
	s.egress = e
	s.mu.Unlock()
	s.signal()
}

// tombstone queues a Tombstone.
func (s *session) tombstone(id string) {
	s.mu.Lock()
	s.tombs = append(s.tombs, id)
	s.mu.Unlock()
	s.signal()
}

// verifySandbox queues a request that the worker check a sandbox a data
// plane could not connect to.
func (s *session) verifySandbox(id string) {
	s.mu.Lock()
	s.verify = append(s.verify, id)
	s.mu.Unlock()
	s.signal()
}

// maxBatchSpecBytes bounds the specs of one Commands message. A worker
// takes messages of up to 64 MiB (rpc.ServerOptions), and one spec with
// its secrets may weigh 33 MiB (spec.MaxSecretsPerFunction values of
// spec.MaxSecretSize, and a spec of up to 1 MiB): the specs of a few such
// functions, queued together (a handshake offers every dual-mode
// function), would make a message the worker refuses, ending the session,
// and the next one the same way.
const maxBatchSpecBytes = 16 << 20

// take returns the next message to send, nil when nothing is queued. Specs
// go in order, as many as fit maxBatchSpecBytes (one at least); the other
// commands go with the last of them, so that no Create precedes its spec.
// The caller takes again until nil.
func (s *session) take() *briskv1.Commands {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.specs)+len(s.creates)+len(s.tombs)+len(s.verify) == 0 && s.egress == nil {
		return nil
	}
	// The policies go first: before the creates of sandboxes they govern.
	egress := s.egress
	s.egress = nil
	n, size := 0, 0
	for n < len(s.specs) {
		sz := proto.Size(s.specs[n])
		if n > 0 && size+sz > maxBatchSpecBytes {
			break
		}
		n, size = n+1, size+sz
	}
	if n < len(s.specs) {
		c := &briskv1.Commands{Specs: s.specs[:n:n], Egress: egress}
		s.specs = s.specs[n:]
		return c
	}
	c := &briskv1.Commands{Specs: s.specs, Creates: s.creates, Tombstones: s.tombs, Verify: s.verify, Egress: egress}
	s.specs, s.creates, s.tombs, s.verify = nil, nil, nil, nil
	return c
}

// runLink keeps a session open to one worker for as long as ctx lives,
// redialling with backoff. The control plane dials: the downstream (worker)
// is the source of truth and answers the handshake.
func (cp *ControlPlane) runLink(ctx context.Context, n *nodeLink, kick <-chan struct{}) {
	var conn *grpc.ClientConn
	var addr string
	defer func() {
		n.conn.Store(nil)
		if conn != nil {
			conn.Close()
		}
	}()
	backoff := 20 * time.Millisecond
	for ctx.Err() == nil {
		cp.cluster.mu.Lock()
		rec, _, _ := cp.cluster.r.Node(n.id)
		cp.cluster.mu.Unlock()
		want := rec.Address
		if conn == nil || want != addr {
			if conn != nil {
				conn.Close()
			}
			var err error
			conn, err = rpc.Dial(want, cp.workerCreds(n.id))
			if err != nil {
				cp.log.Warn("worker address", "node", n.id, "address", want, "err", err)
			}
			n.conn.Store(conn)
			addr = want
		}
		start := time.Now()
		if conn != nil {
			err := cp.session(ctx, n, briskv1.NewWorkerClient(cp.linkConn(conn)))
			if ctx.Err() == nil {
				cp.log.Debug("worker session ended", "node", n.id, "err", err)
			}
		}
		if time.Since(start) > 5*time.Second {
			backoff = 20 * time.Millisecond
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-kick:
			t.Stop()
			backoff = 20 * time.Millisecond
		case <-t.C:
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// linkConn is conn, its streams wrapped by Config.WorkerLinkInterceptor when
// one is set.
func (cp *ControlPlane) linkConn(conn *grpc.ClientConn) grpc.ClientConnInterface {
	if cp.cfg.WorkerLinkInterceptor == nil {
		return conn
	}
	return interceptedConn{conn, cp.cfg.WorkerLinkInterceptor}
}

type interceptedConn struct {
	*grpc.ClientConn
	icpt grpc.StreamClientInterceptor
}

func (c interceptedConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	streamer := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return cc.NewStream(ctx, desc, method, opts...)
	}
	return c.icpt(ctx, desc, c.ClientConn, method, streamer, opts...)
}

// session runs one link session: the handshake, then live updates.
func (cp *ControlPlane) session(ctx context.Context, n *nodeLink, client briskv1.WorkerClient) error {
	c := cp.cluster
	sctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "brisk-node", n.id))
	defer cancel()
	stream, err := client.Session(sctx)
	if err != nil {
		return err
	}
	epoch := randomUint64()
	c.mu.Lock()
	mode := c.r.HandshakeMode(n.id)
	rec, prevBoot, _ := c.r.Node(n.id)
	drain := rec.Drain
	c.mu.Unlock()

	// Handshake, bounded so a hung worker cannot stall its link forever.
	hsTimer := time.AfterFunc(cp.cfg.HandshakeTimeout, cancel)
	start := time.Now()
	err = stream.Send(&briskv1.ToWorker{Epoch: epoch, Msg: &briskv1.ToWorker_Hello{Hello: &briskv1.Hello{
		Epoch: epoch, Mode: modePB(mode), Drain: drain, ControlPlaneId: cp.id, Term: cp.cfg.Term}}})
	if err != nil {
		return err
	}
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	ack := m.GetHelloAck()
	if ack == nil {
		return errors.New("worker answered Hello without HelloAck")
	}
	records, versions := ack.GetRecords(), versionsFromPB(ack.GetVersions())
	// A worker daemon that restarted (new boot id) numbers versions afresh:
	// ours are not comparable with its own, so round 2 fetches every record
	// and the worker's record wins even where its version is not newer.
	rebooted := prevBoot != "" && ack.GetBootId() != prevBoot
	// The worker's sender goes live as soon as it has answered round 1, so a
	// heartbeat or state change can come before the answer to round 2. They
	// are kept, in order, and applied right after the handshake (the worker
	// sent them before its Fetch answer, versions sort out which is newer).
	// Failing the handshake on them instead made every reset handshake with
	// a round 2 fail and retry forever.
	var early []reconciler.Updates
	if mode == reconciler.HandshakeReset {
		// Round 2: fetch only what differs from our cache.
		c.mu.Lock()
		ids := c.r.StaleIDs(n.id, versions, rebooted)
		c.mu.Unlock()
		if len(ids) > 0 {
			if err := stream.Send(&briskv1.ToWorker{Epoch: epoch, Msg: &briskv1.ToWorker_Fetch{Fetch: &briskv1.FetchRequest{Ids: ids}}}); err != nil {
				return err
			}
			for fetched := false; !fetched; {
				m, err := stream.Recv()
				if err != nil {
					return err
				}
				switch {
				case m.GetFetch() != nil:
					records, fetched = m.GetFetch().GetRecords(), true
				case m.GetUpdates() != nil && m.GetEpoch() == epoch:
					early = append(early, updatesFromPB(m.GetUpdates()))
				default:
					return errors.New("worker answered Fetch with something else")
				}
			}
		}
	}
	if !hsTimer.Stop() {
		return fmt.Errorf("handshake with %s timed out", n.id)
	}
	sess := newSession(epoch)
	recs := recordsFromPB(records)
	c.mu.Lock()
	sess.setEgress(c.egress) // before any create of this session
	n.sess = sess
	c.stepLocked(reconciler.SessionUp{Node: n.id, Versions: versions, Records: recs, BootID: ack.GetBootId(),
		Rebooted: rebooted, Drained: drain, Early: early})
	c.mu.Unlock()
	cp.metrics.handshakes.WithLabelValues(modeName(mode)).Inc()
	cp.metrics.handshakeSeconds.Observe(time.Since(start).Seconds())
	cp.log.Info("worker session up", "node", n.id, "mode", modeName(mode), "sandboxes", len(ack.GetVersions()),
		"took", time.Since(start).Round(time.Microsecond))

	sendErr := make(chan error, 1)
	go func() { sendErr <- sendLoop(sctx, stream, sess) }()
	defer func() {
		c.mu.Lock()
		if n.sess == sess {
			n.sess = nil
			// Withdraw not when the control plane itself is stopping (a
			// deposed leader, a shutdown): data planes keep routing on what
			// they have until the next leader's snapshot.
			c.stepLocked(reconciler.SessionDown{Node: n.id, Withdraw: ctx.Err() == nil})
		}
		c.mu.Unlock()
	}()
	// A worker that stops heartbeating (hung, partitioned) ends its session
	// here, long before TCP or gRPC keepalives would notice; the session's
	// end takes its sandboxes out of load balancing.
	var lastRecv atomic.Int64
	lastRecv.Store(time.Now().UnixNano())
	go func() {
		t := time.NewTicker(cp.cfg.HeartbeatTimeout / 4)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if time.Since(time.Unix(0, lastRecv.Load())) > cp.cfg.HeartbeatTimeout {
					cp.log.Warn("worker missed its heartbeats: ending the session", "node", n.id, "timeout", cp.cfg.HeartbeatTimeout)
					cancel()
					return
				}
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		lastRecv.Store(time.Now().UnixNano())
		pu := m.GetUpdates()
		if pu == nil || m.GetEpoch() != epoch {
			continue
		}
		u := updatesFromPB(pu) // outside the cluster's lock
		c.mu.Lock()
		if n.sess == sess {
			c.stepLocked(reconciler.WorkerUpdates{Node: n.id, Updates: u})
		}
		c.mu.Unlock()
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}

func sendLoop(ctx context.Context, stream briskv1.Worker_SessionClient, s *session) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.notify:
		}
		for cmds := s.take(); cmds != nil; cmds = s.take() {
			if err := stream.Send(&briskv1.ToWorker{Epoch: s.epoch, Msg: &briskv1.ToWorker_Commands{Commands: cmds}}); err != nil {
				return err
			}
		}
	}
}

func modeName(m reconciler.HandshakeMode) string {
	if m == reconciler.HandshakeReset {
		return "reset"
	}
	return "recover"
}

func randomUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}
