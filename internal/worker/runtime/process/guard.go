package process

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/pkg/spec"
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
// its own named after its state directory, which exists while a guarded
// sandbox does: made with the first, deleted with the last. A restarted
// worker replaces its predecessor's table in one transaction with its
// adopted sandboxes' entries, or deletes it when it adopted none.

// guard is a runtime's loopback guard; nil when sandboxes share a user.
// Its table exists while a guarded sandbox does: made with the first,
// deleted with the last.
type guard struct {
	mu        sync.Mutex
	table     *nftables.Table
	ports     *nftables.Set
	owned     *nftables.Set
	counts    map[uint16]int // sandboxes per port: a port is in ports while any holds it
	entries   map[guardEntry]int
	installed bool
}

const (
	guardPortsID = 1
	guardOwnedID = 2
)

func newGuard(stateDir string) *guard {
	h := sha256.Sum256([]byte(stateDir))
	t := &nftables.Table{Name: "brisk_proc_" + hex.EncodeToString(h[:6]), Family: nftables.TableFamilyINet}
	return &guard{table: t, counts: map[uint16]int{}, entries: map[guardEntry]int{},
		ports: &nftables.Set{Table: t, Name: "ports", ID: guardPortsID, KeyType: nftables.TypeInetService},
		owned: &nftables.Set{Table: t, Name: "owned", ID: guardOwnedID, Concatenation: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeUID, nftables.TypeInetService)}}
}

// reset makes the table hold exactly entries (an earlier worker's adopted
// sandboxes), replacing whatever a predecessor on the same state
// directory left, or deletes it when there are none.
func (g *guard) reset(entries []guardEntry) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.counts)
	clear(g.entries)
	for _, e := range entries {
		g.counts[e.port]++
		g.entries[e]++
	}
	if len(entries) == 0 {
		g.installed = true // so that uninstall deletes a leftover table
		return g.uninstallLocked()
	}
	return g.installLocked()
}

// installLocked replaces the table with one holding g's entries, in one
// transaction.
func (g *guard) installLocked() error {
	c, err := nftables.New()
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
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelTable(g.table)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("loopback guard: %w", err)
	}
	g.installed = false
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
	g.counts[e.port]++
	g.entries[e]++
	if !g.installed {
		err := g.installLocked()
		if err != nil {
			g.dropLocked(e)
		}
		return err
	}
	c, err := nftables.New()
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

// forget undoes allow once the sandbox is gone; the table goes with the
// last guarded sandbox.
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
	if len(g.entries) == 0 {
		return g.uninstallLocked()
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if g.entries[e] == 0 {
		if err := c.SetDeleteElements(g.owned, []nftables.SetElement{{Key: ownedKey(e)}}); err != nil {
			return err
		}
	}
	if g.counts[e.port] == 0 {
		if err := c.SetDeleteElements(g.ports, []nftables.SetElement{{Key: portKey(e.port)}}); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("loopback guard: %w", err)
	}
	return nil
}

// entryOf is rec's guard entry (uid 0: none).
func entryOf(rec record) guardEntry { return guardEntry{uid: rec.UID, port: uint16(portOf(rec.Addr))} }

// guardSandbox records sb's function user and enters its port in the
// guard, before its process starts.
func (r *Runtime) guardSandbox(sb *sandbox, f *spec.Function, port int) error {
	if r.users == nil {
		return nil
	}
	id, err := r.users.identityOf(f)
	if err != nil {
		return err
	}
	sb.rec.UID = id.uid
	return r.guard.allow(entryOf(sb.rec))
}
