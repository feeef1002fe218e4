package netpool

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Endpoint is one sandbox's network: a named namespace holding eth0 with IP,
// whose peer HostVeth sits on the pool's bridge. Take hands out a fresh
// *Endpoint each time, so a stale Release of an earlier holder is a no-op.
type Endpoint struct {
	Name     string     // e.g. "brisk-7": netns name under /var/run/netns
	NetNS    string     // path to the namespace, /var/run/netns/<Name> (bind-mounted so it outlives any process)
	IP       netip.Addr // the sandbox's address (inside the namespace, on eth0)
	Gateway  netip.Addr
	HostVeth string // host end, attached to the bridge

	rec *record
	gen uint64 // rec.gen when taken: identifies this lease
}

// sandboxIf is the interface name inside every namespace.
const sandboxIf = "eth0"

type recState uint8

const (
	stateBuilding   recState = iota // being created; not yet handed out
	stateReady                      // in the ready stack
	stateInUse                      // held by a sandbox
	stateCleaning                   // released; being reset for reuse
	stateDestroying                 // being (or failed to be) torn down
)

// record is the pool's view of one endpoint. The pool's mutex guards state
// and gen; the remaining mutable fields belong to whichever single goroutine
// state says is building, cleaning or tearing down the record.
type record struct {
	idx  int // offset of ip in the subnet; also names the endpoint
	name string
	path string
	ip   netip.Addr

	state recState
	gen   uint64

	// nsh is a netlink socket inside the namespace, kept for recycling. It
	// also pins the namespace, so teardown closes it first.
	nsh  *netlink.Handle
	eth0 int // ifindex of eth0 inside the namespace

	// Teardown progress. A done step is never repeated, so a teardown that
	// failed halfway resumes where it stopped on the next attempt.
	vethGone, unmounted, fileGone bool
}

func (p *Pool) newRecord(idx int) *record {
	name := endpointName(p.cfg.NamePrefix, idx)
	return &record{idx: idx, name: name, path: filepath.Join(netnsDir, name), ip: addrAt(p.cfg.Subnet, idx)}
}

func (r *record) lease(gw netip.Addr) *Endpoint {
	return &Endpoint{Name: r.name, NetNS: r.path, IP: r.ip, Gateway: gw, HostVeth: r.name, rec: r, gen: r.gen}
}

func (p *Pool) ipNet(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(p.cfg.Subnet.Bits(), 32)}
}

// build creates the endpoint in the kernel. On error the record may be
// half-built; the caller tears it down.
func (p *Pool) build(r *record) error {
	// The bind-mount target must exist. O_EXCL: a leftover here means an
	// earlier worker's teardown did not finish; Cleanup (run by Start) owns that.
	f, err := os.OpenFile(r.path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("netpool: %s: %w", r.name, err)
	}
	f.Close()
	ns, nsh, mounted, err := newNamedNS(r.path)
	r.nsh = nsh
	if !mounted {
		r.unmounted = true
	}
	if ns.IsOpen() {
		defer ns.Close()
	}
	if err != nil {
		return fmt.Errorf("netpool: %s: %w", r.name, err)
	}

	// The peer is created directly inside the namespace under its final
	// name: one request instead of create, move and rename.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = r.name
	attrs.MasterIndex = p.bridgeIndex
	attrs.Flags = net.FlagUp
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: sandboxIf, PeerNamespace: netlink.NsFd(ns)}
	// Before the veth exists: its first frame meets the address check.
	if err := p.addPort(r); err != nil {
		return fmt.Errorf("netpool: %s: firewall: %w", r.name, err)
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("netpool: %s: add veth: %w", r.name, err)
	}
	// Isolated bridge ports forward only to the bridge itself (the host),
	// never to each other: sandboxes of different functions cannot talk
	// directly, while the data plane on the host reaches every one.
	if err := netlink.LinkSetIsolated(veth, true); err != nil {
		return fmt.Errorf("netpool: %s: isolate bridge port: %w", r.name, err)
	}
	eth0, err := nsh.LinkByName(sandboxIf)
	if err != nil {
		return fmt.Errorf("netpool: %s: find %s: %w", r.name, sandboxIf, err)
	}
	r.eth0 = eth0.Attrs().Index
	if err := nsh.AddrAdd(eth0, &netlink.Addr{IPNet: p.ipNet(r.ip)}); err != nil {
		return fmt.Errorf("netpool: %s: add address %v: %w", r.name, r.ip, err)
	}
	if err := nsh.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("netpool: %s: set %s up: %w", r.name, sandboxIf, err)
	}
	if err := nsh.RouteAdd(p.defaultRoute(r)); err != nil {
		return fmt.Errorf("netpool: %s: add default route: %w", r.name, err)
	}
	return nil
}

func (p *Pool) defaultRoute(r *record) *netlink.Route {
	return &netlink.Route{LinkIndex: r.eth0, Gw: p.gateway.AsSlice()}
}

// teardown deletes the host veth (its peer goes with it), unmounts and
// removes the namespace file. Every step tolerates "already gone", so it
// also serves half-built records and leftovers.
func (p *Pool) teardown(r *record) error {
	if r.nsh != nil {
		r.nsh.Close()
		r.nsh = nil
	}
	if !r.vethGone {
		if err := p.fault(r, "veth"); err != nil {
			return err
		}
		if err := deleteLink(r.name); err != nil {
			return fmt.Errorf("netpool: %s: delete veth: %w", r.name, err)
		}
		r.vethGone = true
		// Best effort: forget the host's neighbour entry, so that the next
		// endpoint given this address is not sent to the old MAC meanwhile.
		_ = netlink.NeighDel(&netlink.Neigh{LinkIndex: p.bridgeIndex, Family: netlink.FAMILY_V4, IP: r.ip.AsSlice()})
	}
	if !r.unmounted {
		if err := p.fault(r, "unmount"); err != nil {
			return err
		}
		if err := unmount(r.path); err != nil {
			return fmt.Errorf("netpool: %s: %w", r.name, err)
		}
		r.unmounted = true
	}
	if !r.fileGone {
		if err := p.fault(r, "remove"); err != nil {
			return err
		}
		if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("netpool: %s: %w", r.name, err)
		}
		r.fileGone = true
	}
	return nil
}

// fault is the test hook for failing a teardown step.
func (p *Pool) fault(r *record, step string) error {
	if p.faultHook == nil {
		return nil
	}
	return p.faultHook(r.name, step)
}

// deleteLink deletes the host link name; a missing link is success.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return err
	}
	return nil
}

// unmount detaches the namespace bind mount at path; nothing mounted (EINVAL)
// or no file (ENOENT) is success.
func unmount(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err == nil || err == unix.EINVAL || err == unix.ENOENT {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", path, err)
}

// reset returns a released endpoint to the state build left it in: only lo
// and eth0, eth0 up with exactly its address, and only the default route
// besides the kernel's connected ones. It covers links, addresses and
// main-table routes, what a sandbox could change with CAP_NET_ADMIN in the
// common case; anything that fails makes the caller destroy the endpoint.
func (p *Pool) reset(r *record) error {
	h := r.nsh
	if h == nil {
		return errors.New("no netlink socket")
	}
	links, err := retryDump(h.LinkList)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var eth0 netlink.Link
	for _, l := range links {
		a := l.Attrs()
		switch {
		case a.Name == "lo":
			if a.Flags&net.FlagUp == 0 {
				if err := h.LinkSetUp(l); err != nil {
					return fmt.Errorf("set lo up: %w", err)
				}
			}
		case a.Name == sandboxIf && a.Index == r.eth0:
			eth0 = l
		default:
			// ENODEV: a veth whose peer we deleted a moment ago.
			if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("delete stray link %s: %w", a.Name, err)
			}
		}
	}
	if eth0 == nil {
		return fmt.Errorf("%s (index %d) is gone", sandboxIf, r.eth0)
	}
	if eth0.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(eth0); err != nil {
			return fmt.Errorf("set %s up: %w", sandboxIf, err)
		}
	}

	want := p.ipNet(r.ip)
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(eth0, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	haveAddr := false
	for _, a := range addrs {
		switch {
		case a.IP.Equal(want.IP) && a.Mask.String() == want.Mask.String():
			haveAddr = true
		case a.IP.To4() == nil && a.IP.IsLinkLocalUnicast():
			// The kernel's own IPv6 link-local address.
		default:
			if err := h.AddrDel(eth0, &a); err != nil {
				return fmt.Errorf("delete address %v: %w", a.IPNet, err)
			}
		}
	}
	if !haveAddr {
		if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: want}); err != nil {
			return fmt.Errorf("add address: %w", err)
		}
	}

	routes, err := retryDump(func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	haveDefault := false
	for _, rt := range routes {
		switch {
		case rt.Protocol == unix.RTPROT_KERNEL:
			// Connected routes follow the addresses.
		case isDefault(rt) && rt.LinkIndex == r.eth0 && rt.Gw.Equal(p.gateway.AsSlice()) && !haveDefault:
			haveDefault = true
		default:
			if err := h.RouteDel(&rt); err != nil {
				return fmt.Errorf("delete route %v: %w", rt, err)
			}
		}
	}
	if !haveDefault {
		if err := h.RouteAdd(p.defaultRoute(r)); err != nil {
			return fmt.Errorf("add default route: %w", err)
		}
	}
	return nil
}

func isDefault(rt netlink.Route) bool {
	if rt.Dst == nil {
		return true
	}
	ones, _ := rt.Dst.Mask.Size()
	return ones == 0
}

// retryDump repeats a netlink dump the kernel reports as interrupted by a
// concurrent change (netlink v1.3 returns partial results with
// ErrDumpInterrupted); other errors end it.
func retryDump[T any](dump func() ([]T, error)) ([]T, error) {
	for range 5 {
		res, err := dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return res, err
		}
	}
	return nil, netlink.ErrDumpInterrupted
}
