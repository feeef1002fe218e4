package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
)

// An HA control plane has 3 or 5 replicas, each serving the admin API
// (followers pass requests on to the leader). A client given several
// replicas (New with a comma-separated list, or Replicas) sends each
// request to the one that answered last and moves to the next when that
// one cannot serve it, as far as moving is safe:
//
//   - the request never reached the replica (it got no connection): any
//     method moves;
//   - the replica answered that it passed nothing on (api.HeaderNotForwarded:
//     it knows no leader, cannot dial it, or no longer leads): any method;
//   - anything else of unknown outcome (a timeout after the request was
//     sent, a 503 from a leader that lost its term mid-write): only GET and
//     HEAD move. A write is not sent twice, a PUT neither: if the first
//     was applied, the repeat would be applied after writes others made
//     meanwhile and undo them (the partition lab's porcupine check caught
//     exactly that). Its error says the outcome is unknown.
//
// The partition lab (docs/reliability.md, "Partitions") measures it.

// failoverDialTimeout bounds a connection attempt of New's clients to a
// replica list: a replica cut off by a partition drops the connection's
// packets, and without a bound the next replica would be tried only after
// the system's connect timeout (minutes).
const failoverDialTimeout = 3 * time.Second

// splitAdmins is New's admin argument as base URLs: one address, or a
// comma-separated list of an HA control plane's replicas.
func splitAdmins(admin string) []string {
	var out []string
	for a := range strings.SplitSeq(admin, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, baseURL(a))
		}
	}
	return out
}

// failoverTransport is http.DefaultTransport with failoverDialTimeout.
func failoverTransport() http.RoundTripper {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport
	}
	t = t.Clone()
	d := &net.Dialer{Timeout: failoverDialTimeout, KeepAlive: 30 * time.Second}
	t.DialContext = d.DialContext
	return t
}

// admins is every replica's base URL, Admin first.
func (c *Client) admins() []string {
	if len(c.Replicas) == 0 {
		return []string{c.Admin}
	}
	return append([]string{c.Admin}, c.Replicas...)
}

// CurrentAdmin is the admin API the client sends to now: Admin, or the
// replica that answered last.
func (c *Client) CurrentAdmin() string {
	all := c.admins()
	return all[int(c.current.Load())%len(all)]
}

// sendAdmin sends a request to the admin API with hc (c.HTTP unless a
// caller needs other timeouts), moving between replicas by the rules
// above. The reply's body is the caller's to close. unknown: an earlier
// attempt may have been applied (it was sent and not answered, or
// answered with a 503 that did not say it passed nothing on), so that
// the reply, whatever it says, does not prove the request was not.
func (c *Client) sendAdmin(ctx context.Context, hc *http.Client, method, path string, body []byte, contentType string) (resp *http.Response, unknown bool, err error) {
	all := c.admins()
	first := int(c.current.Load()) % len(all)
	// Only reads are sent again after an attempt of unknown outcome: a
	// write (a PUT too) repeated after that attempt was applied would be
	// applied again, after writes others made meanwhile, undoing them.
	idempotent := method == http.MethodGet || method == http.MethodHead
	var errs []error
	for i := range all {
		k := (first + i) % len(all)
		base := all[k]
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		// A request that got no connection was certainly not sent; one that
		// got one may have been, even if its write had not been reported
		// when the call returned (a timeout races the write).
		var sent atomic.Bool
		trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { sent.Store(true) }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, base+path, rd)
		if err != nil {
			return nil, unknown, err
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		c.authorize(req)
		resp, err := hc.Do(req)
		last := i == len(all)-1
		if err != nil {
			unknown = unknown || sent.Load()
			errs = append(errs, fmt.Errorf("cannot reach the control plane at %s: %w", base, err))
			if last || ctx.Err() != nil || (sent.Load() && !idempotent) {
				if unknown && len(all) > 1 {
					errs = append(errs, errors.New("the request was sent: whether it was applied is unknown"))
					// Not sent again, but the next request starts at the
					// next replica: this one may be paused or cut off, and
					// a writer would otherwise meet it every time.
					c.current.CompareAndSwap(int32(k), int32((k+1)%len(all)))
				}
				return nil, unknown, &sendError{err: errors.Join(errs...), notApplied: !unknown}
			}
			continue
		}
		if resp.StatusCode == http.StatusServiceUnavailable && !last {
			notForwarded := resp.Header.Get(api.HeaderNotForwarded) != ""
			if notForwarded || idempotent {
				unknown = unknown || !notForwarded
				resp.Body.Close()
				errs = append(errs, fmt.Errorf("the control plane at %s: %s", base, http.StatusText(resp.StatusCode)))
				continue
			}
		}
		if resp.StatusCode != http.StatusServiceUnavailable {
			c.current.Store(int32(k))
		} else if len(all) > 1 {
			c.current.CompareAndSwap(int32(k), int32((k+1)%len(all))) // as above
		}
		return resp, unknown, nil
	}
	return nil, unknown, errors.Join(errs...) // not reached: the last replica returns
}

// sendError is sendAdmin's failure to get a reply from any replica.
type sendError struct {
	err        error
	notApplied bool // no attempt can have been applied
}

func (e *sendError) Error() string { return e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }
