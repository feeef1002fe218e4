package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/brisk-faas/brisk/internal/h1"
)

// wireClient sends one request, always the same bytes, over kept-alive
// HTTP/1.1 connections with brisk's own wire code (internal/h1) instead of
// net/http's client. The accept benchmark runs its clients on the cores
// that run the cluster: net/http's client (a request and a header map per
// call, a goroutine pair per connection and channel hand-offs between
// them) took about a third of the CPU and of the allocations of an
// accepted call there, so what it measured was largely the generator.
// Plain http:// only; https and h2c take net/http's client.
type wireClient struct {
	addr    string
	req     []byte
	timeout time.Duration
	free    chan *wireConn
	dialer  net.Dialer
}

type wireConn struct {
	nc   net.Conn
	br   *bufio.Reader
	head []byte
	rh   h1.ReplyHead
	cr   h1.ChunkedReader
}

// newWireClient prepares method path on host with header and body; each
// call is bounded by timeout.
func newWireClient(addr, method, path, host string, header http.Header, body []byte, timeout time.Duration) (*wireClient, error) {
	b := []byte(method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\n")
	keys := make([]string, 0, len(header))
	for k := range header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !h1.IsToken([]byte(k)) {
			return nil, fmt.Errorf("header name %q", k)
		}
		for _, v := range header[k] {
			if !h1.ValidValue([]byte(v)) {
				return nil, fmt.Errorf("header %s: value %q", k, v)
			}
			b = append(b, k+": "+v+"\r\n"...)
		}
	}
	b = append(b, "Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"...)
	b = append(b, body...)
	return &wireClient{addr: addr, req: b, timeout: timeout, free: make(chan *wireConn, 256)}, nil
}

// wireReply is what a call got: the status, one header's value, and the
// start of the body.
type wireReply struct {
	code  int
	value string // of the header do was asked for
	body  []byte // at most its first 512 bytes
}

// do sends the request and reads the reply, with the value of header
// want (its name in lower case). A connection that failed or that the server closes is not used
// again.
func (w *wireClient) do(ctx context.Context, want string) (wireReply, error) {
	var c *wireConn
	select {
	case c = <-w.free:
	default:
		nc, err := w.dialer.DialContext(ctx, "tcp", w.addr)
		if err != nil {
			return wireReply{}, err
		}
		c = &wireConn{nc: nc, br: bufio.NewReaderSize(nc, 4096)}
	}
	rep, keep, err := c.exchange(w, want)
	if err != nil || !keep {
		c.nc.Close()
		return rep, err
	}
	select {
	case w.free <- c:
	default:
		c.nc.Close()
	}
	return rep, nil
}

func (c *wireConn) exchange(w *wireClient, want string) (rep wireReply, keep bool, err error) {
	if err := c.nc.SetDeadline(time.Now().Add(w.timeout)); err != nil {
		return rep, false, err
	}
	if _, err := c.nc.Write(w.req); err != nil {
		return rep, false, err
	}
	c.head, _, err = h1.ReadHead(c.br, c.head[:0])
	if err != nil {
		return rep, false, err
	}
	if err := h1.ParseReplyHead(c.head, &c.rh); err != nil {
		return rep, false, err
	}
	rep.code = c.rh.Code
	for _, s := range c.rh.Hdrs {
		if h1.EqualFold(s.Name(c.head), want) {
			rep.value = string(s.Value(c.head))
			break
		}
	}
	var body io.Reader
	switch {
	case c.rh.Code == http.StatusNoContent || c.rh.Code == http.StatusNotModified || c.rh.Code < 200:
		return rep, c.rh.KeepAlive, nil
	case c.rh.Chunked:
		c.cr.Reset(c.br)
		body = &c.cr
	case c.rh.Length >= 0:
		body = io.LimitReader(c.br, c.rh.Length)
	default:
		body = c.br // to the end of the connection
	}
	var buf [512]byte
	n, err := io.ReadFull(body, buf[:])
	rep.body = append([]byte(nil), buf[:n]...)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	if err == nil && n == len(buf) {
		_, err = io.Copy(io.Discard, body)
	}
	if c.rh.Length >= 0 && !c.rh.Chunked && err == nil && int64(n) < c.rh.Length && n < len(buf) {
		err = io.ErrUnexpectedEOF // cut short
	}
	return rep, err == nil && c.rh.KeepAlive && (c.rh.Chunked || c.rh.Length >= 0), err
}

// close closes the idle connections.
func (w *wireClient) close() {
	for {
		select {
		case c := <-w.free:
			c.nc.Close()
		default:
			return
		}
	}
}
