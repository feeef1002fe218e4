package controlplane

import (
	"net"
	"sync"
)

// handoff keeps one of a replica's listening sockets open across its
// changes of role. The leader's servers and the follower's are separate
// and take turns: each serves a view of the socket, and closing a view
// ends that server's accepting, not the socket. Without it the socket
// closed and was bound again at every election, and clients connecting
// then were refused (the partition lab's finding 5,
// docs/reliability.md); now they wait in the socket's queue for the next
// role's server.
type handoff struct {
	ln    net.Listener
	conns chan net.Conn
	stop  chan struct{} // closed by close
	done  chan struct{} // closed when the accept loop has ended
	once  sync.Once
}

func newHandoff(ln net.Listener) *handoff {
	h := &handoff{ln: ln, conns: make(chan net.Conn), stop: make(chan struct{}), done: make(chan struct{})}
	go h.accept()
	return h
}

// accept passes each connection to whichever view takes it.
func (h *handoff) accept() {
	defer close(h.done)
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return // the socket is closed (close): nothing is accepted any more
		}
		select {
		case h.conns <- c:
		case <-h.stop:
			c.Close()
			return
		}
	}
}

// close closes the socket for good.
func (h *handoff) close() {
	h.once.Do(func() {
		close(h.stop)
		h.ln.Close()
	})
	<-h.done
}

// view is a listener for one role's server.
func (h *handoff) view() net.Listener { return &handoffView{h: h, closed: make(chan struct{})} }

type handoffView struct {
	h      *handoff
	once   sync.Once
	closed chan struct{}
}

func (v *handoffView) Accept() (net.Conn, error) {
	select {
	case <-v.closed: // a closed view takes nothing more, even if one waits
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-v.h.conns:
		return c, nil
	case <-v.closed:
		return nil, net.ErrClosed
	case <-v.h.done:
		return nil, net.ErrClosed
	}
}

// Close ends this view's accepting; the socket stays open for the next.
func (v *handoffView) Close() error {
	v.once.Do(func() { close(v.closed) })
	return nil
}

func (v *handoffView) Addr() net.Addr { return v.h.ln.Addr() }
