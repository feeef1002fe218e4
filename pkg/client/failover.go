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
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
)

// An HA control plane has 3 or 5 replicas, each serving the admin API
// (followers pass requests on to the leader). A client given several
// replicas (New with a comma-separated list, or Replicas) sends each
// request to the one that answered last and moves to the next when that
// one cannot serve it, as far as moving is safe:
//
//   - the request never reached the replica (no connection, or it was not
//     written whole): any method moves;
//   - the replica answered that it passed nothing on (api.HeaderNotForwarded:
//     it knows no leader, cannot dial it, or no longer leads): any method;
//   - anything else of unknown outcome (a timeout after the request was
//     sent, a 503 from a leader that lost its term mid-write): only GET,
//     HEAD and PUT move, whose repeat changes nothing a first one did not.
//     A POST or DELETE is not sent twice; its error says the outcome is
//     unknown.
//
// The partition lab (docs/reliability.md, "Partitions") measures it.

// errNotSent marks an error of a request that never reached a replica
// whole (NotApplied).
var errNotSent = errors.New("not sent")

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
// above. The reply's body is the caller's to close.
func (c *Client) sendAdmin(ctx context.Context, hc *http.Client, method, path string, body []byte, contentType string) (*http.Response, error) {
	all := c.admins()
	first := int(c.current.Load()) % len(all)
	idempotent := method == http.MethodGet || method == http.MethodHead || method == http.MethodPut
	var errs []error
	for i := range all {
		k := (first + i) % len(all)
		base := all[k]
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		wrote := false
		trace := &httptrace.ClientTrace{WroteRequest: func(w httptrace.WroteRequestInfo) { wrote = w.Err == nil }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, base+path, rd)
		if err != nil {
			return nil, err
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		c.authorize(req)
		resp, err := hc.Do(req)
		last := i == len(all)-1
		if err != nil {
			if !wrote {
				err = fmt.Errorf("%w: %w", errNotSent, err)
			}
			err = fmt.Errorf("cannot reach the control plane at %s: %w", base, err)
			if last || ctx.Err() != nil || (wrote && !idempotent) {
				if wrote && !idempotent && len(all) > 1 {
					err = fmt.Errorf("%w (the request was sent: whether it was applied is unknown)", err)
				}
				return nil, errors.Join(append(errs, err)...)
			}
			errs = append(errs, err)
			continue
		}
		if resp.StatusCode == http.StatusServiceUnavailable && !last &&
			(resp.Header.Get(api.HeaderNotForwarded) != "" || idempotent) {
			resp.Body.Close()
			errs = append(errs, fmt.Errorf("the control plane at %s: %s", base, http.StatusText(resp.StatusCode)))
			continue
		}
		if resp.StatusCode != http.StatusServiceUnavailable {
			c.current.Store(int32(k))
		}
		return resp, nil
	}
	return nil, errors.Join(errs...) // not reached: the last replica returns
}
