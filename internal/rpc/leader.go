package rpc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// LeaderHintKey is the trailer in which a control-plane replica that is not
// the leader names the leader's gRPC address.
const LeaderHintKey = "brisk-leader"

// NotLeader is the error a follower replica answers with: Unavailable, so
// that callers retry, with the leader's address (when known) in the
// LeaderHintKey trailer, which the caller must set with grpc.SetTrailer.
func NotLeader(leader string) error {
	if leader == "" {
		return status.Error(codes.Unavailable, "not the control-plane leader, and no leader is elected yet")
	}
	return status.Errorf(codes.Unavailable, "not the control-plane leader; the leader is %s", leader)
}

// LeaderConn is a grpc.ClientConnInterface over the replicas of a control
// plane that sends every call to the current leader. A unary call answered by
// a follower is retried at the leader the follower names; a call that finds
// its replica unreachable moves on to the next address. Streams go to the
// replica believed to be the leader: callers that keep a stream open make a
// unary call before each (re)open, which finds the leader. With one address it
// behaves as a plain connection.
type LeaderConn struct {
	mu    sync.Mutex
	addrs []string
	cur   int
	conns map[string]*grpc.ClientConn
	creds credentials.TransportCredentials
}

// DialLeader returns a LeaderConn over the comma-separated or listed
// addresses, with creds (nil: plaintext). Connections are made lazily, per
// address.
func DialLeader(creds credentials.TransportCredentials, addrs ...string) (*LeaderConn, error) {
	var list []string
	for _, a := range addrs {
		for _, s := range strings.Split(a, ",") {
			if s = strings.TrimSpace(s); s != "" && !slices.Contains(list, s) {
				list = append(list, s)
			}
		}
	}
	if len(list) == 0 {
		return nil, errors.New("no control-plane address")
	}
	l := &LeaderConn{addrs: list, conns: map[string]*grpc.ClientConn{}, creds: creds}
	for _, a := range list {
		c, err := Dial(a, creds)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("control plane %s: %w", a, err)
		}
		l.conns[a] = c
	}
	return l, nil
}

// Current is the address calls go to now.
func (l *LeaderConn) Current() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addrs[l.cur]
}

// Close closes every connection.
func (l *LeaderConn) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	clear(l.conns)
	return nil
}

func (l *LeaderConn) current() (string, *grpc.ClientConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.addrs[l.cur]
	return a, l.conns[a]
}

// follow makes hint the current address, dialling it when it is new.
func (l *LeaderConn) follow(hint string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.addrs, hint); i >= 0 {
		l.cur = i
		return
	}
	c, err := Dial(hint, l.creds)
	if err != nil {
		return
	}
	l.conns[hint] = c
	l.addrs = append(l.addrs, hint)
	l.cur = len(l.addrs) - 1
}

// skip moves past addr if it is still the current one.
func (l *LeaderConn) skip(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.addrs[l.cur] == addr {
		l.cur = (l.cur + 1) % len(l.addrs)
	}
}

// Invoke implements grpc.ClientConnInterface.
func (l *LeaderConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	var err error
	// Each replica at most twice: a follower's hint may point at a replica
	// that has just lost leadership in turn.
	for range 2*len(l.addrs) + 1 {
		addr, conn := l.current()
		if conn == nil {
			return status.Error(codes.Canceled, "control-plane connection closed")
		}
		var trailer metadata.MD
		err = conn.Invoke(ctx, method, args, reply, append(opts, grpc.Trailer(&trailer))...)
		if err == nil || ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return err
		}
		if hint := trailer.Get(LeaderHintKey); len(hint) > 0 && hint[0] != "" && hint[0] != addr {
			l.follow(hint[0])
			continue
		}
		if len(l.addrs) == 1 {
			return err
		}
		l.skip(addr)
	}
	return err
}

// NewStream implements grpc.ClientConnInterface: the stream goes to the
// current address. A stream refused by a follower or cut by a dying leader
// makes the next stream go to the next replica.
func (l *LeaderConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	addr, conn := l.current()
	if conn == nil {
		return nil, status.Error(codes.Canceled, "control-plane connection closed")
	}
	s, err := conn.NewStream(ctx, desc, method, opts...)
	if err != nil && status.Code(err) == codes.Unavailable {
		l.skip(addr)
	}
	return s, err
}
