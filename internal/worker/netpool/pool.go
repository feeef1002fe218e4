package netpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// Errors Take returns.
var (
	ErrNotStarted = errors.New("netpool: pool not started")
	ErrClosed     = errors.New("netpool: pool closed")
	ErrExhausted  = errors.New("netpool: subnet has no free address")
)

// Stats is a snapshot of a pool's gauges (Ready, InUse) and counters.
type Stats struct {
	Ready, InUse, Created, CreatedOnDemand, Recycled, Destroyed int64
}

const (
	// fillParallelism bounds concurrent creations by Start and the refiller.
	// The kernel serialises most of the work (rtnl, net namespace setup), so
	// a few in flight hide the round trips without queueing dozens.
	fillParallelism = 8
	// backgroundParallelism bounds concurrent recycles and destroys, which
	// compete for the same kernel locks as on-demand creations on a cold
	// start's critical path.
	backgroundParallelism = 4
	retryMin, retryMax    = 100 * time.Millisecond, 5 * time.Second
	startUndoTimeout      = 30 * time.Second
)

// Pool hands out pre-created Endpoints. Take, Release and Stats are safe for
// concurrent use. The mutex guards only list and counter operations; no
// kernel call runs under it.
type Pool struct {
	cfg     Config
	log     *slog.Logger
	gateway netip.Addr

	// Set by Start before any endpoint exists; read-only afterwards.
	bridgeIndex  int
	ownBridge    bool // Start created the bridge: Close deletes it
	addedGateway bool // Start put the gateway address on a foreign bridge: Close removes it

	bg        chan struct{}                 // semaphore for background recycles and destroys
	kick      chan struct{}                 // wakes the refiller; capacity 1, never blocks
	autoFill  bool                          // tests turn the refiller off for determinism
	faultHook func(name, step string) error // tests fail teardown steps; nil in production

	dns    *dnsForwarder // the sandboxes' resolver (Config.DNS); guarded by mu
	egress egress        // namespaces' egress policies (egress.go)

	closeMu    sync.Mutex // serialises Close calls
	bridgeDone bool       // Close undid Start's bridge work; guarded by closeMu

	mu        sync.Mutex
	started   bool
	running   bool // bridge ready: Take may create endpoints
	closed    bool
	cancel    context.CancelFunc
	ready     []*record // LIFO: the most recently recycled is warmest
	all       map[*record]struct{}
	doomed    []*record    // teardowns that failed, retried by the refiller and Close
	freeIdx   []int        // indices (addresses) of destroyed endpoints
	nextIdx   int          // lowest never-used index
	adopted   map[int]bool // indices of adopted endpoints: never handed out by nextIdx
	inUse     int
	creating  int // refiller creations in flight
	recycling int // releases being reset for reuse
	created   int64
	onDemand  int64
	recycled  int64
	destroyed int64
	bgWG      sync.WaitGroup // refiller and every asynchronous operation; Add only under mu while !closed
}

// New validates cfg (errors name the field) and returns a Pool. It creates
// nothing; Start does.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Pool{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "netpool", "bridge", cfg.Bridge),
		gateway:  gatewayOf(cfg.Subnet),
		bg:       make(chan struct{}, backgroundParallelism),
		kick:     make(chan struct{}, 1),
		autoFill: true,
		all:      make(map[*record]struct{}),
		nextIdx:  firstIndex,
		adopted:  make(map[int]bool),
	}, nil
}

// Adopt takes over the endpoint named name, which an earlier worker process
// with this configuration left in use: a sandbox of its still runs in it.
// Start's cleanup then leaves it (and the bridge) alone, its address is not
// handed out while it is leased, and Release treats it as any endpoint Take
// returned. Adopt must come before Start; it fails for a name this pool
// would not make or whose namespace or host link is gone, and the caller
// then tears the sandbox down instead.
func (p *Pool) Adopt(name string) (*Endpoint, error) {
	idxStr, ok := strings.CutPrefix(name, p.cfg.NamePrefix+"-")
	idx, err := strconv.Atoi(idxStr)
	if !ok || err != nil || !nameRE(p.cfg.NamePrefix).MatchString(name) || idx < firstIndex || idx > lastIndex(p.cfg.Subnet) {
		return nil, fmt.Errorf("netpool: adopt %q: not an endpoint of pool %s in %v", name, p.cfg.NamePrefix, p.cfg.Subnet)
	}
	r := p.newRecord(idx)
	if _, err := os.Stat(r.path); err != nil {
		return nil, fmt.Errorf("netpool: adopt %s: %w", name, err)
	}
	if _, err := netlink.LinkByName(r.name); err != nil {
		return nil, fmt.Errorf("netpool: adopt %s: host link: %w", name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed {
		return nil, fmt.Errorf("netpool: adopt %s: the pool has started", name)
	}
	if p.adopted[idx] {
		return nil, fmt.Errorf("netpool: adopt %s: adopted twice", name)
	}
	p.adopted[idx] = true
	p.all[r] = struct{}{}
	return p.handOutLocked(r), nil
}

// Start ensures the bridge (up, with the gateway address), reaps leftovers of
// an earlier worker with the same NamePrefix (Cleanup), pre-fills Size
// endpoints and starts the refiller, which runs until Close. Leftovers
// include namespaces a previous worker's sandboxes may still be using: the
// caller reaps or abandons those sandboxes first. If Start fails it undoes
// its work, and the Pool is closed.
func (p *Pool) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.started || p.closed {
		p.mu.Unlock()
		return errors.New("netpool: Start called twice or after Close")
	}
	p.started = true
	p.bgWG.Add(1) // a concurrent Close waits for Start
	p.mu.Unlock()

	err := p.start(ctx)
	p.bgWG.Done()
	if err != nil {
		// Bounded: a teardown that keeps failing must not hang Start; a
		// later Close or Cleanup finishes the job.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startUndoTimeout)
		defer cancel()
		return errors.Join(err, p.Close(cctx))
	}
	return nil
}

func (p *Pool) start(ctx context.Context) error {
	keep := map[string]bool{}
	keepIPs := map[netip.Addr]bool{}
	var adopted []*record
	p.mu.Lock()
	for r := range p.all { // only adopted ones exist before Start
		keep[r.name] = true
		keepIPs[r.ip] = true
		adopted = append(adopted, r)
	}
	p.mu.Unlock()
	if err := cleanup(ctx, p.cfg, keep); err != nil {
		return err
	}
	if err := ensureNetnsDir(); err != nil {
		return err
	}
	if err := p.ensureBridge(); err != nil {
		return err
	}
	// Before any endpoint exists (adopted ones aside, whose sandboxes the
	// previous worker's rules, replaced here in one step, kept in).
	var port uint16
	if p.cfg.DNS {
		ups := p.cfg.DNSUpstreams
		if len(ups) == 0 {
			var err error
			if ups, err = HostResolvers(); err != nil || len(ups) == 0 {
				p.log.Warn("sandbox DNS: no nameserver in the host's resolv.conf: sandboxes' queries will fail", "err", err)
			}
		}
		f, err := startDNS(p.gateway, p.cfg.Subnet, ups, p.log)
		if err != nil {
			return fmt.Errorf("netpool: sandbox DNS forwarder on %v: %w", p.gateway, err)
		}
		p.mu.Lock()
		p.dns = f
		p.mu.Unlock()
		port = f.port()
		p.log.Info("sandbox DNS forwarder", "listen", netip.AddrPortFrom(p.gateway, port), "upstreams", ups)
	}
	if p.cfg.Egress || len(p.cfg.Ingress) > 0 {
		if err := enableForwarding(); err != nil {
			return err
		}
	}
	if !p.cfg.NoFirewall {
		if err := installFirewall(p.cfg, port, adopted); err != nil {
			return err
		}
		p.log.Info("sandbox firewall installed", "table", firewallTable(p.cfg.NamePrefix), "allow_host_ports", p.cfg.AllowHostPorts,
			"egress", p.cfg.Egress, "egress_deny", p.cfg.EgressDeny, "ingress", p.cfg.Ingress)
		if err := p.openEgress(keepIPs); err != nil {
			return err
		}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.running = true
	p.mu.Unlock()

	t0 := time.Now()
	if err := p.fill(ctx); err != nil {
		return fmt.Errorf("netpool: pre-fill: %w", err)
	}
	p.log.Info("network pool ready", "size", p.cfg.Size, "took", time.Since(t0))

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.autoFill {
		// The refiller outlives Start's ctx: it stops at Close.
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		p.cancel = cancel
		p.bgWG.Add(1)
		go p.refiller(runCtx)
	}
	return nil
}

// ipForward is the host's IPv4 forwarding switch.
const ipForward = "/proc/sys/net/ipv4/ip_forward"

// enableForwarding turns the host's IPv4 forwarding on (Config.Egress,
// Config.Ingress): sandboxes' connections beyond the host, and data
// planes' connections into the pool's subnet, are routed through it. It is a
// host-wide setting, left on at Close (as container runtimes leave it):
// something else may have come to rely on it meanwhile.
func enableForwarding() error {
	if b, err := os.ReadFile(ipForward); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(ipForward, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("netpool: egress and ingress need IPv4 forwarding (%s): %w", ipForward, err)
	}
	return nil
}

// ResolvConf is the /etc/resolv.conf a sandbox of this pool gets, or ""
// when the pool serves no DNS.
func (p *Pool) ResolvConf() string {
	if !p.cfg.DNS {
		return ""
	}
	return ResolvConf(p.gateway)
}

// ensureBridge finds or creates the bridge, brings it up and gives it the
// gateway address.
func (p *Pool) ensureBridge() error {
	name := p.cfg.Bridge
	br, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("netpool: bridge %s: %w", name, err)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		br = &netlink.Bridge{LinkAttrs: attrs}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("netpool: create bridge %s: %w", name, err)
		}
		p.ownBridge = true
		// The kernel ignores an alias given at creation, hence a second request.
		if err := netlink.LinkSetAlias(br, bridgeAlias(p.cfg.NamePrefix)); err != nil {
			return fmt.Errorf("netpool: bridge %s: set alias: %w", name, err)
		}
	} else if br.Type() != "bridge" {
		return fmt.Errorf("netpool: Bridge %s exists and is a %s, not a bridge", name, br.Type())
	} else if br.Attrs().Alias == bridgeAlias(p.cfg.NamePrefix) {
		p.ownBridge = true // kept by cleanup for adopted endpoints: still ours
	}
	p.bridgeIndex = br.Attrs().Index
	if p.ownBridge {
		if err := pinBridgeMAC(name); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("netpool: set bridge %s up: %w", name, err)
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(br, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("netpool: bridge %s addresses: %w", name, err)
	}
	gw := p.ipNet(p.gateway)
	for _, a := range addrs {
		if a.IPNet.String() == gw.String() {
			return nil
		}
	}
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: gw}); err != nil {
		return fmt.Errorf("netpool: bridge %s: add gateway %v: %w", name, gw, err)
	}
	p.addedGateway = !p.ownBridge
	return nil
}

// pinBridgeMAC sets the bridge's address to the one it has. A bridge whose
// address was never set takes the lowest MAC of its ports, so it changes as
// endpoints join and leave; sandboxes keep the gateway's old MAC in their
// neighbour cache, and their replies vanish until the entry expires (a call
// in flight stalled for 13 s when a scale-up added endpoints). A set
// address stays.
func pinBridgeMAC(name string) error {
	br, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netpool: bridge %s: %w", name, err)
	}
	if err := netlink.LinkSetHardwareAddr(br, br.Attrs().HardwareAddr); err != nil {
		return fmt.Errorf("netpool: bridge %s: pin MAC address: %w", name, err)
	}
	return nil
}

// Take returns a ready endpoint, which costs a lock and a pop. When none is
// ready it creates one on the caller's goroutine (counted in
// CreatedOnDemand) rather than wait for the refiller. ctx is checked before
// that creation; the creation itself (a few ms of syscalls) runs to the end.
func (p *Pool) Take(ctx context.Context) (*Endpoint, error) {
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return nil, ErrClosed
	case !p.running:
		p.mu.Unlock()
		return nil, ErrNotStarted
	}
	if n := len(p.ready); n > 0 {
		r := p.ready[n-1]
		p.ready[n-1] = nil
		p.ready = p.ready[:n-1]
		ep := p.handOutLocked(r)
		p.mu.Unlock()
		p.wakeRefiller()
		return ep, nil
	}
	p.bgWG.Add(1) // Close waits for this creation
	p.mu.Unlock()
	defer p.bgWG.Done()

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := p.create()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.created++
	p.onDemand++
	if p.closed {
		return nil, ErrClosed // Close destroys r with everything else
	}
	return p.handOutLocked(r), nil
}

func (p *Pool) handOutLocked(r *record) *Endpoint {
	r.state = stateInUse
	r.gen++
	p.inUse++
	return r.lease(p.gateway)
}

// Release returns an endpoint whose sandbox is gone (the caller guarantees
// no process is left in the namespace). It never blocks on the kernel: the
// endpoint is reset and put back, or destroyed when MaxReady endpoints are
// ready already, in the background. Releasing the same lease twice, a lease
// whose endpoint was taken again since, or after Close, does nothing.
func (p *Pool) Release(ep *Endpoint) {
	if ep == nil || ep.rec == nil {
		return
	}
	r := ep.rec
	p.mu.Lock()
	if _, ours := p.all[r]; !ours || p.closed || r.state != stateInUse || r.gen != ep.gen {
		p.mu.Unlock()
		return
	}
	p.inUse--
	// An adopted endpoint has no netlink socket in its namespace to reset
	// it with: it is destroyed, and the refiller makes a fresh one.
	recycle := len(p.ready)+p.recycling < p.cfg.MaxReady && r.nsh != nil
	if recycle {
		r.state = stateCleaning
		p.recycling++
	} else {
		r.state = stateDestroying
	}
	p.bgWG.Add(1)
	p.mu.Unlock()
	go p.finishRelease(r, recycle)
}

func (p *Pool) finishRelease(r *record, recycle bool) {
	defer p.bgWG.Done()
	p.bg <- struct{}{}
	defer func() { <-p.bg }()
	if err := p.unbind(r.ip); err != nil {
		// The next Bind of the address replaces its binding anyway.
		p.log.Warn("endpoint's egress binding not removed", "endpoint", r.name, "err", err)
	}
	if recycle {
		err := p.reset(r)
		p.mu.Lock()
		p.recycling--
		if p.closed {
			p.mu.Unlock()
			return // Close destroys every record
		}
		if err == nil {
			r.state = stateReady
			p.ready = append(p.ready, r)
			p.recycled++
			p.mu.Unlock()
			return
		}
		r.state = stateDestroying
		p.mu.Unlock()
		p.log.Warn("endpoint could not be reset; destroying it", "endpoint", r.name, "err", err)
		p.wakeRefiller() // the pool may now be short of Size
	}
	if !p.destroy(r) {
		p.wakeRefiller() // it retries failed teardowns
	}
}

// create allocates an address and builds an endpoint for it. A half-built
// endpoint is torn down before returning the error (or left to the retry
// loop if that fails too).
func (p *Pool) create() (*record, error) {
	p.mu.Lock()
	idx, ok := p.allocIndexLocked()
	if !ok {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w %v", ErrExhausted, p.cfg.Subnet)
	}
	r := p.newRecord(idx)
	p.all[r] = struct{}{}
	p.mu.Unlock()

	if err := p.build(r); err != nil {
		p.mu.Lock()
		r.state = stateDestroying
		p.mu.Unlock()
		if !p.destroy(r) {
			p.wakeRefiller() // it retries failed teardowns
		}
		return nil, err
	}
	return r, nil
}

func (p *Pool) allocIndexLocked() (int, bool) {
	if n := len(p.freeIdx); n > 0 {
		idx := p.freeIdx[n-1]
		p.freeIdx = p.freeIdx[:n-1]
		return idx, true
	}
	for p.adopted[p.nextIdx] {
		p.nextIdx++
	}
	if p.nextIdx > lastIndex(p.cfg.Subnet) {
		return 0, false
	}
	p.nextIdx++
	return p.nextIdx - 1, true
}

// destroy tears r down and forgets it, returning its address to the free
// list only once nothing of it is left (so no two endpoints ever share an
// address or a name). A failed teardown is queued for retry.
func (p *Pool) destroy(r *record) bool {
	err := p.teardown(r)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.doomed = append(p.doomed, r)
		p.log.Warn("endpoint teardown failed; will retry", "endpoint", r.name, "err", err)
		return false
	}
	p.forgetLocked(r)
	return true
}

func (p *Pool) forgetLocked(r *record) {
	delete(p.all, r)
	delete(p.adopted, r.idx)
	p.freeIdx = append(p.freeIdx, r.idx)
	p.destroyed++
}

func (p *Pool) wakeRefiller() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// refiller keeps Ready at Size and retries failed teardowns, backing off
// while something keeps failing.
func (p *Pool) refiller(ctx context.Context) {
	defer p.bgWG.Done()
	backoff := time.Duration(0)
	for {
		var retry <-chan time.Time // nil: wait for a kick only
		if backoff > 0 {
			retry = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-retry:
		}
		err := errors.Join(p.retryDoomed(), p.fill(ctx))
		switch {
		case err == nil && !p.hasDoomed():
			backoff = 0
		case backoff == 0:
			backoff = retryMin
		default:
			backoff = min(2*backoff, retryMax)
		}
		if err != nil && ctx.Err() == nil {
			p.log.Warn("refill failed; backing off", "err", err, "retry_in", backoff)
		}
	}
}

func (p *Pool) hasDoomed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.doomed) > 0
}

// retryDoomed retries every failed teardown once.
func (p *Pool) retryDoomed() error {
	p.mu.Lock()
	doomed := p.doomed
	p.doomed = nil
	p.mu.Unlock()
	var errs []error
	for _, r := range doomed {
		if !p.destroy(r) {
			errs = append(errs, fmt.Errorf("netpool: %s: teardown still failing", r.name))
		}
	}
	return errors.Join(errs...)
}

// fill creates endpoints until Ready (counting those being created or
// recycled) reaches Size, fillParallelism at a time.
func (p *Pool) fill(ctx context.Context) error {
	for ctx.Err() == nil {
		p.mu.Lock()
		n := min(p.cfg.Size-len(p.ready)-p.creating-p.recycling, fillParallelism)
		if p.closed || n <= 0 {
			p.mu.Unlock()
			return nil
		}
		p.creating += n
		p.mu.Unlock()

		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				r, err := p.create()
				p.mu.Lock()
				defer p.mu.Unlock()
				p.creating--
				if err != nil {
					errs[i] = err
					return
				}
				p.created++
				if p.closed {
					return // Close destroys r with everything else
				}
				r.state = stateReady
				p.ready = append(p.ready, r)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Stats returns a snapshot of the pool's gauges and counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		Ready:           int64(len(p.ready)),
		InUse:           int64(p.inUse),
		Created:         p.created,
		CreatedOnDemand: p.onDemand,
		Recycled:        p.recycled,
		Destroyed:       p.destroyed,
	}
}

// Close stops the refiller, waits for background work, then destroys every
// endpoint, ready or in use, retrying failed teardowns until they succeed or
// ctx ends, and finally removes the bridge if Start created it (or the
// gateway address if Start added it to an existing bridge) and the pool's
// firewall tables. After Close,
// Take returns ErrClosed. If ctx ends first, Close reports what is left and
// a later Close carries on from there; once everything is gone, Close
// returns nil.
func (p *Pool) Close(ctx context.Context) error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	p.mu.Lock()
	p.closed = true
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}

	waited := make(chan struct{})
	go func() { p.bgWG.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		return fmt.Errorf("netpool: close: waiting for background work: %w", ctx.Err())
	}

	// Background work is over and closed keeps it from restarting, so the
	// records are ours alone now.
	p.mu.Lock()
	recs := make([]*record, 0, len(p.all))
	for r := range p.all {
		recs = append(recs, r)
	}
	p.ready, p.doomed, p.inUse = nil, nil, 0
	p.mu.Unlock()

	backoff := retryMin
	for len(recs) > 0 {
		recs = p.destroyAll(recs)
		if len(recs) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("netpool: close: %d endpoints not torn down: %w", len(recs), ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, retryMax)
	}
	p.mu.Lock()
	dns := p.dns
	p.dns = nil
	p.mu.Unlock()
	if dns != nil {
		dns.close()
	}
	if !p.bridgeDone {
		if err := p.removeBridge(); err != nil {
			return err
		}
		p.bridgeDone = true
	}
	// Last: the rules protect every endpoint left behind by an earlier
	// failure. Tables of the prefix are this pool's even if Start failed
	// before installing them (a predecessor's are then gone with its
	// endpoints, which cleanup removed).
	if !p.cfg.NoFirewall {
		if err := removeFirewall(p.cfg.NamePrefix); err != nil {
			return err
		}
	}
	return nil
}

// destroyAll tears recs down in parallel and returns those that failed.
func (p *Pool) destroyAll(recs []*record) []*record {
	var (
		mu     sync.Mutex
		failed []*record
		wg     sync.WaitGroup
		sem    = make(chan struct{}, fillParallelism)
	)
	for _, r := range recs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := p.teardown(r)
			p.mu.Lock()
			if err == nil {
				p.forgetLocked(r)
			}
			p.mu.Unlock()
			if err != nil {
				p.log.Warn("endpoint teardown failed; retrying", "endpoint", r.name, "err", err)
				mu.Lock()
				failed = append(failed, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

func (p *Pool) removeBridge() error {
	switch {
	case p.ownBridge:
		if err := deleteLink(p.cfg.Bridge); err != nil {
			return fmt.Errorf("netpool: delete bridge %s: %w", p.cfg.Bridge, err)
		}
	case p.addedGateway:
		br, err := netlink.LinkByName(p.cfg.Bridge)
		if err != nil {
			return fmt.Errorf("netpool: bridge %s: %w", p.cfg.Bridge, err)
		}
		if err := netlink.AddrDel(br, &netlink.Addr{IPNet: p.ipNet(p.gateway)}); err != nil {
			return fmt.Errorf("netpool: bridge %s: remove gateway: %w", p.cfg.Bridge, err)
		}
	}
	return nil
}
