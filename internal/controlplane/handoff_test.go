package controlplane

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// countingListener counts the connections its Accept returned.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// A client that connects while one role's server has stopped and the
// next has not started is served by the next, not refused; closing the
// handoff closes the socket.
func TestHandoffKeepsTheSocketBetweenRoles(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	h := newHandoff(cl)
	serve := func(answer string) *http.Server {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, answer) }),
			ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(h.view())
		return srv
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	get := func() (string, error) {
		resp, err := hc.Get("http://" + ln.Addr().String() + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	leader := serve("leader")
	if got, err := get(); err != nil || got != "leader" {
		t.Fatalf("first role: %q, %v", got, err)
	}
	if err := leader.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	type result struct {
		body string
		err  error
	}
	between := make(chan result, 1)
	go func() { b, err := get(); between <- result{b, err} }()
	for cl.n.Load() < 2 { // the client's connection is accepted, no server takes it yet
		time.Sleep(time.Millisecond)
	}
	follower := serve("follower")
	defer follower.Close()
	if r := <-between; r.err != nil || r.body != "follower" {
		t.Fatalf("a client connecting between roles: %q, %v; want the next role's answer", r.body, r.err)
	}
	h.close()
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the socket still accepts after close")
	}
}
