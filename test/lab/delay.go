package lab

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Delay without netem. This machine's kernel has no sch_netem (nor
// nftables' queue expression), but it has nfnetlink_queue and iptables'
// NFQUEUE target: an iptables rule hands h's outgoing packets to a queue,
// and a reader in the test process, bound to that queue in h's network
// namespace, accepts each one after the delay. The reader speaks the
// queue's netlink protocol itself (a handful of messages; no module for it
// is served here): bind the queue, copy only the packet id, and answer
// each packet with an accept verdict.

// The nfnetlink queue protocol's numbers (linux/netfilter/nfnetlink_queue.h).
const (
	nfnlSubsysQueue = 3
	nfqnlMsgPacket  = 0
	nfqnlMsgVerdict = 1
	nfqnlMsgConfig  = 2
	nfqaPacketHdr   = 1
	nfqaVerdictHdr  = 2
	nfqaCfgCmd      = 1
	nfqaCfgParams   = 2
	nfqnlCfgCmdBind = 1
	nfqnlCopyMeta   = 1
	nfAccept        = 1
)

// delayer delays the packets of one queue in one namespace.
type delayer struct {
	conn   *netlink.Conn
	queue  uint16
	d, jit time.Duration
	wg     sync.WaitGroup
}

// startDelayer binds queue in the namespace at nsPath and accepts each
// packet queued there after d (± jitter).
func startDelayer(nsPath string, queue uint16, d, jitter time.Duration) (*delayer, error) {
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns.Fd())})
	if err != nil {
		return nil, fmt.Errorf("nfqueue: %w", err)
	}
	q := &delayer{conn: conn, queue: queue, d: d, jit: jitter}
	cmd := make([]byte, 4) // command, pad, protocol family (unused by bind)
	cmd[0] = nfqnlCfgCmdBind
	params := make([]byte, 5) // copy range, copy mode
	params[4] = nfqnlCopyMeta
	for _, attr := range []netlink.Attribute{{Type: nfqaCfgCmd, Data: cmd}, {Type: nfqaCfgParams, Data: params}} {
		if err := q.send(nfqnlMsgConfig, attr, true); err != nil {
			conn.Close()
			return nil, fmt.Errorf("nfqueue: binding queue %d: %w", queue, err)
		}
	}
	q.wg.Go(q.run)
	return q, nil
}

// send sends one queue message with one attribute; ack: and waits for
// the kernel's acknowledgement (before run reads the socket).
func (q *delayer) send(typ int, attr netlink.Attribute, ack bool) error {
	b, err := netlink.MarshalAttributes([]netlink.Attribute{attr})
	if err != nil {
		return err
	}
	hdr := []byte{unix.AF_UNSPEC, 0, 0, 0} // nfgenmsg: family, version, queue (big-endian)
	binary.BigEndian.PutUint16(hdr[2:], q.queue)
	m := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysQueue<<8 | typ), Flags: netlink.Request},
		Data:   append(hdr, b...),
	}
	if ack {
		m.Header.Flags |= netlink.Acknowledge
		_, err = q.conn.Execute(m)
		return err
	}
	_, err = q.conn.Send(m)
	return err
}

// run reads queued packets until the connection closes, and schedules
// each one's verdict.
func (q *delayer) run() {
	for {
		msgs, err := q.conn.Receive()
		if err != nil {
			return
		}
		for _, m := range msgs {
			if int(m.Header.Type)&0xff != nfqnlMsgPacket || len(m.Data) < 4 {
				continue
			}
			attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
			if err != nil {
				continue
			}
			for _, a := range attrs {
				if a.Type&^unix.NLA_F_NESTED != nfqaPacketHdr || len(a.Data) < 4 {
					continue
				}
				id := binary.BigEndian.Uint32(a.Data[:4])
				wait := q.d
				if q.jit > 0 {
					wait += time.Duration(rand.Int64N(int64(2*q.jit))) - q.jit
				}
				time.AfterFunc(wait, func() {
					verdict := make([]byte, 8)
					binary.BigEndian.PutUint32(verdict, nfAccept)
					binary.BigEndian.PutUint32(verdict[4:], id)
					_ = q.send(nfqnlMsgVerdict, netlink.Attribute{Type: nfqaVerdictHdr, Data: verdict}, false)
				})
			}
		}
	}
}

// close unbinds the queue (closing the socket does). The caller removes
// the rule first; packets still held are dropped by the kernel, and TCP
// sends them again. Verdicts of timers still running fail and are
// ignored.
func (q *delayer) close() {
	_ = q.conn.Close()
	q.wg.Wait()
}
