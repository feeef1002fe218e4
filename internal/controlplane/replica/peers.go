package replica

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Peer is one control-plane replica of the static membership.
type Peer struct {
	ID        string // raft server id, stable for the replica's lifetime
	RaftAddr  string // host:port of the raft transport, dialled by the other replicas
	AdminAddr string // host:port of its admin HTTP API, for redirecting clients to the leader
	GRPCAddr  string // host:port of its gRPC API, for redirecting workers and data planes
}

// ParsePeers parses a static membership list:
//
//	id=raft|admin|grpc,id2=raft|admin|grpc,...
//
// for example "cp1=127.0.0.1:7101|127.0.0.1:7001|127.0.0.1:7201,cp2=...".
// Every address is host:port with a non-zero port; raft addresses must be
// dialable (no empty or unspecified host) and, like ids, unique.
func ParsePeers(s string) ([]Peer, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("replica: empty peer list (want id=raft|admin|grpc,...)")
	}
	var peers []Peer
	ids := map[string]bool{}
	raftAddrs := map[string]string{}
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		where := fmt.Sprintf("replica: peer %d (%q)", i+1, entry)
		if entry == "" {
			return nil, fmt.Errorf("%s: empty entry (stray comma?)", where)
		}
		id, addrs, ok := strings.Cut(entry, "=")
		id = strings.TrimSpace(id)
		if !ok {
			return nil, fmt.Errorf("%s: missing '=' (want id=raft|admin|grpc)", where)
		}
		if err := checkID(id); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if ids[id] {
			return nil, fmt.Errorf("%s: duplicate id %q", where, id)
		}
		parts := strings.Split(addrs, "|")
		if len(parts) != 3 {
			return nil, fmt.Errorf("%s: want 3 addresses raft|admin|grpc, got %d", where, len(parts))
		}
		p := Peer{ID: id}
		for j, dst := range []*string{&p.RaftAddr, &p.AdminAddr, &p.GRPCAddr} {
			name := [...]string{"raft", "admin", "grpc"}[j]
			a := strings.TrimSpace(parts[j])
			if a == "" {
				return nil, fmt.Errorf("%s: missing %s address", where, name)
			}
			if err := checkAddr(a, j == 0); err != nil {
				return nil, fmt.Errorf("%s: bad %s address %q: %w", where, name, a, err)
			}
			*dst = a
		}
		if other, dup := raftAddrs[p.RaftAddr]; dup {
			return nil, fmt.Errorf("%s: raft address %s already used by %q", where, p.RaftAddr, other)
		}
		ids[id] = true
		raftAddrs[p.RaftAddr] = id
		peers = append(peers, p)
	}
	return peers, nil
}

// checkID keeps ids to characters that survive flags, logs and file names.
func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("empty id")
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("id %q: only letters, digits, '-', '_' and '.' are allowed", id)
		}
	}
	return nil
}

// checkAddr accepts host:port with a port in 1..65535. A dialled address
// (raft) must also name a host: 0.0.0.0 or an empty host would point the
// other replicas at themselves.
func checkAddr(a string, dialled bool) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not in 1..65535", port)
	}
	if dialled {
		if host == "" {
			return fmt.Errorf("empty host")
		}
		if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
			return fmt.Errorf("unspecified host %s cannot be dialled by the other replicas", host)
		}
	}
	return nil
}

// validatePeers applies ParsePeers' rules to a membership built in code.
func validatePeers(peers []Peer) error {
	if len(peers) == 0 {
		return fmt.Errorf("replica: no peers")
	}
	ids := map[string]bool{}
	raftAddrs := map[string]bool{}
	for i, p := range peers {
		where := fmt.Sprintf("replica: peer %d (%q)", i+1, p.ID)
		if err := checkID(p.ID); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if ids[p.ID] {
			return fmt.Errorf("%s: duplicate id", where)
		}
		if err := checkAddr(p.RaftAddr, true); err != nil {
			return fmt.Errorf("%s: bad raft address %q: %w", where, p.RaftAddr, err)
		}
		if raftAddrs[p.RaftAddr] {
			return fmt.Errorf("%s: duplicate raft address %s", where, p.RaftAddr)
		}
		ids[p.ID], raftAddrs[p.RaftAddr] = true, true
	}
	return nil
}
