package replica

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/pki"
)

// With TLS, replicas replicate over mutual TLS under the cluster CA, and
// nothing without a control-plane certificate of that CA gets a raft
// connection: neither plain TCP nor a certificate of another CA.
func TestRaftOverMutualTLS(t *testing.T) {
	ca, err := pki.CreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3)
	c.tls = func(i int) *Identity {
		id, err := ca.Issue(pki.KindControlPlane, []string{c.peers[i].ID}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return &Identity{Server: id.ServerTLS(true, pki.KindControlPlane), Client: id.ClientTLS(pki.KindControlPlane, "")}
	}
	c.startAll()
	leader := c.regs[c.leader()]
	waitLeader(t, leader)
	if _, err := leader.CreateFunction(fn("over-tls")); err != nil {
		t.Fatal(err)
	}
	c.converge(contents(t, leader))

	addr := c.peers[0].RaftAddr
	// Plain TCP speaking raft's framing: the TLS server refuses it.
	plain, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	req := append([]byte{0}, bytes.Repeat([]byte{0x81}, 63)...) // rpcAppendEntries, then msgpack-like bytes
	_, _ = plain.Write(req)
	_ = plain.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	var rerr error
	for rerr == nil { // a TLS alert may come first; then the connection ends
		_, rerr = plain.Read(buf)
	}
	if ne, ok := rerr.(net.Error); ok && ne.Timeout() {
		t.Fatal("a plain TCP peer kept a raft connection open")
	}
	// A certificate of another CA.
	other, err := pki.CreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := other.Issue(pki.KindControlPlane, []string{"cp1"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rogue.ClientTLS(pki.KindControlPlane, "")
	cfg.InsecureSkipVerify, cfg.VerifyConnection = true, func(tls.ConnectionState) error { return nil } // the rogue trusts anything
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err == nil {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil {
		t.Fatal("a peer with another CA's certificate got a raft connection")
	}
}
