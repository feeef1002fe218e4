package process

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The loopback guard. Process sandboxes listen on the host's own
// addresses (127.0.0.1 by default), where any local process can connect:
// without a guard a sandbox could call another function's sandbox
// directly, past the data plane and its invoke tokens. With per-function
// users (users.go) the kernel knows which function a connecting socket
// belongs to, so one nf_tables rule refuses a sandbox user's connections
// to this runtime's sandbox ports, but to its own function's:
//
//	table inet brisk_proc_<hash of the state directory>
//	  set ports { type inet_service }             this runtime's sandbox ports
//	  set owned { type uid . inet_service }       (function user, port) of each
//	  chain output (hook output, priority filter, policy accept)
//	    meta skuid & 0xfff00000 == FunctionUIDBase  oifname "lo"  meta l4proto tcp
//	      th dport @ports  meta skuid . th dport != @owned  reject with tcp reset
//
// Nothing else changes: the data plane, the readiness probe and every
// other process of the host are no function user and pass; a sandbox
// still reaches the data plane (function-to-function calls), other local
// services and the world. Each runtime guards its own ports, in a table of
// its own named after its state directory. A restarted worker replaces its
// predecessor's table in one transaction with its adopted sandboxes'
// entries; Shutdown (the worker's exit) deletes it when no sandbox is
// left. A worker killed for good, its state directory deleted, leaves its
// table behind (it refuses only ports nothing listens on any more).

// guard is a runtime's loopback guard; nil when sandboxes share a user.
// Its table lives as long as the runtime (Shutdown): making and deleting
// it each cost a transaction that waits for an RCU grace period.
type guard struct {
	mu        sync.Mutex
	table     *nftables.Table
	ports     *nftables.Set
	owned     *nftables.Set
	counts    map[uint16]int // sandboxes per port: a port is in ports while any holds it
	entries   map[guardEntry]int
	installed bool
	// Deleting set elements costs a transaction that waits for an RCU
	// grace period (13 ms here, against 0.3 ms to add one): what forget
	// takes out waits here and goes in one transaction shortly after
	// (flushDelay), or at once before allow hands one of its ports out
	// again.
	pendingOwned map[guardEntry]bool
	pendingPorts map[uint16]bool
	flushing     bool
	conn         *nftables.Conn // one netlink socket for the runtime's life
}

// connLocked is g's netlink connection, made on first use.
func (g *guard) connLocked() (*nftables.Conn, error) {
	if g.conn == nil {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return nil, err
		}
		g.conn = c
	}
	return g.conn, nil
}

// flushDelay is how long forget's deletions wait to be batched. A
// deletion's transaction holds the kernel's nf_tables commit lock for its
// grace period, holding up every other transaction (a sandbox's allow, the
// network pool's): batched once a second, that is about 1 % of the time.
const flushDelay = time.Second

const (
	guardPortsID = 1
	guardOwnedID = 2
)

func newGuard(stateDir string) *guard {
	h := sha256.Sum256([]byte(stateDir))
	t := &nftables.Table{Name: "brisk_proc_" + hex.EncodeToString(h[:6]), Family: nftables.TableFamilyINet}
	return &guard{table: t, counts: map[uint16]int{}, entries: map[guardEntry]int{},
		pendingOwned: map[guardEntry]bool{}, pendingPorts: map[uint16]bool{},
		ports: &nftables.Set{Table: t, Name: "ports", ID: guardPortsID, KeyType: nftables.TypeInetService},
		owned: &nftables.Set{Table: t, Name: "owned", ID: guardOwnedID, Concatenation: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeUID, nftables.TypeInetService)}}
}

// reset makes the table hold exactly entries (an earlier worker's adopted
// sandboxes), replacing whatever a predecessor on the same state
// directory left.
func (g *guard) reset(entries []guardEntry) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.counts)
	clear(g.entries)
	clear(g.pendingOwned)
	clear(g.pendingPorts)
	for _, e := range entries {
		g.counts[e.port]++
		g.entries[e]++
	}
	return g.installLocked()
}

// installLocked replaces the table with one holding g's entries, in one
// transaction.
func (g *guard) installLocked() error {
	c, err := g.connLocked()
	if err != nil {
		return err
	}
	c.AddTable(g.table)
	c.DelTable(g.table)
	c.AddTable(g.table)
	var ports, owned []nftables.SetElement
	for p := range g.counts {
		ports = append(ports, nftables.SetElement{Key: portKey(p)})
	}
	for e := range g.entries {
		owned = append(owned, nftables.SetElement{Key: ownedKey(e)})
	}
	if err := c.AddSet(g.ports, ports); err != nil {
		return err
	}
	if err := c.AddSet(g.owned, owned); err != nil {
		return err
	}
	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "output", Table: g.table, Hooknum: nftables.ChainHookOutput,
		Priority: nftables.ChainPriorityFilter, Type: nftables.ChainTypeFilter, Policy: &accept})
	lo := make([]byte, unix.IFNAMSIZ)
	copy(lo, "lo")
	c.AddRule(&nftables.Rule{Table: g.table, Chain: out, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^uint32(maxFunctionUsers - 1)), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(FunctionUIDBase)},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: lo},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: g.ports.Name, SetID: g.ports.ID},
		// skuid . dport, in registers 8 and 9.
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 8},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 8, SetName: g.owned.Name, SetID: g.owned.ID, Invert: true},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("loopback guard: %w", err)
	}
	g.installed = true
	return nil
}

func (g *guard) uninstallLocked() error {
	if !g.installed {
		return nil
	}
	c, err := g.connLocked()
	if err != nil {
		return err
	}
	c.DelTable(g.table)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("loopback guard: %w", err)
	}
	g.installed = false
	clear(g.pendingOwned)
	clear(g.pendingPorts)
	return nil
}

// guardEntry is one sandbox's: its function user and its port.
type guardEntry struct {
	uid  uint32
	port uint16
}

func portKey(port uint16) []byte { return binaryutil.BigEndian.PutUint16(port) }

func ownedKey(e guardEntry) []byte {
	k := make([]byte, 8) // uid, then the port padded to a register's 4 bytes
	copy(k, binaryutil.NativeEndian.PutUint32(e.uid))
	copy(k[4:], binaryutil.BigEndian.PutUint16(e.port))
	return k
}

// allow lets e's function user reach its port, and refuses the port to the
// other function users; before the sandbox listens.
func (g *guard) allow(e guardEntry) error {
	if g == nil || e.uid == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pendingPorts[e.port] || g.pendingOwned[e] {
		// The port was another sandbox's a moment ago: its entries go
		// first, or its function could still reach this one.
		if err := g.flushLocked(); err != nil {
			return err
		}
	}
	g.counts[e.port]++
	g.entries[e]++
	if !g.installed {
		err := g.installLocked()
		if err != nil {
			g.dropLocked(e)
		}
		return err
	}
	c, err := g.connLocked()
	if err == nil {
		if g.counts[e.port] == 1 {
			err = c.SetAddElements(g.ports, []nftables.SetElement{{Key: portKey(e.port)}})
		}
		if err == nil {
			err = c.SetAddElements(g.owned, []nftables.SetElement{{Key: ownedKey(e)}})
		}
		if err == nil {
			err = c.Flush()
		}
	}
	if err != nil {
		g.dropLocked(e)
		return fmt.Errorf("loopback guard: %w", err)
	}
	return nil
}

// dropLocked takes e out of the counts.
func (g *guard) dropLocked(e guardEntry) {
	if g.counts[e.port]--; g.counts[e.port] <= 0 {
		delete(g.counts, e.port)
	}
	if g.entries[e]--; g.entries[e] <= 0 {
		delete(g.entries, e)
	}
}

// forget undoes allow once the sandbox is gone: within flushDelay, or at
// once when allow reuses its port.
func (g *guard) forget(e guardEntry) error {
	if g == nil || e.uid == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.entries[e] == 0 {
		return nil
	}
	g.dropLocked(e)
	if g.entries[e] == 0 {
		g.pendingOwned[e] = true
	}
	if g.counts[e.port] == 0 {
		g.pendingPorts[e.port] = true
	}
	if !g.flushing {
		g.flushing = true
		time.AfterFunc(flushDelay, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.flushing = false
			_ = g.flushLocked() // a failure leaves them pending: the next flush retries
		})
	}
	return nil
}

// flushLocked deletes the pending entries in one transaction.
func (g *guard) flushLocked() error {
	if !g.installed || (len(g.pendingOwned) == 0 && len(g.pendingPorts) == 0) {
		return nil
	}
	c, err := g.connLocked()
	if err != nil {
		return err
	}
	var owned, ports []nftables.SetElement
	for e := range g.pendingOwned {
		owned = append(owned, nftables.SetElement{Key: ownedKey(e)})
	}
	for p := range g.pendingPorts {
		ports = append(ports, nftables.SetElement{Key: portKey(p)})
	}
	if len(owned) > 0 {
		if err := c.SetDeleteElements(g.owned, owned); err != nil {
			return err
		}
	}
	if len(ports) > 0 {
		if err := c.SetDeleteElements(g.ports, ports); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("loopback guard: %w", err)
	}
	clear(g.pendingOwned)
	clear(g.pendingPorts)
	return nil
}

// entryOf is rec's guard entry (uid 0: none).
func entryOf(rec record) guardEntry { return guardEntry{uid: rec.UID, port: uint16(portOf(rec.Addr))} }

// guardSandbox records sb's function user id and enters its port in the
// guard, before its process starts (nothing without per-function users).
func (r *Runtime) guardSandbox(sb *sandbox, id identity, port int) error {
	if r.users == nil {
		return nil
	}
	sb.rec.UID = id.uid
	return r.guard.allow(entryOf(sb.rec))
}

// Shutdown removes what the runtime keeps on the host for its sandboxes
// (the loopback guard's table) once none is left; with sandboxes left for
// a successor to adopt it keeps it. The worker calls it as it exits.
func (r *Runtime) Shutdown() error {
	r.mu.Lock()
	left := len(r.sandboxes)
	r.mu.Unlock()
	if left > 0 || r.guard == nil {
		return nil
	}
	r.guard.mu.Lock()
	defer r.guard.mu.Unlock()
	err := r.guard.uninstallLocked()
	if r.guard.conn != nil {
		_ = r.guard.conn.CloseLasting()
		r.guard.conn = nil
	}
	return err
}
