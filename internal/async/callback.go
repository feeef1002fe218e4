package async

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// errCallbackAddr refuses a callback to an address outside the allowed
// ranges.
var errCallbackAddr = errors.New("address not allowed")

// newCallbackClient returns the client callbacks use. It checks the address
// each connection actually dials (after DNS), so a name that resolves to a
// refused address is refused too.
func newCallbackClient(allow []netip.Prefix, timeout time.Duration) *http.Client {
	d := &net.Dialer{Timeout: timeout, Control: PublicOnly(allow, "--async-callback-allow")}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:         d.DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     30 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// PublicOnly is a net.Dialer Control that refuses every address but
// public ones and those allow holds (callbackAllowed), checked on the
// address each connection actually dials (after DNS). flag names the
// setting that widens allow, for the error. Connections brisk makes on a
// tenant's behalf (callbacks, triggers' external NATS servers) dial
// through it.
func PublicOnly(allow []netip.Prefix, flag string) func(network, address string, c syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return err
		}
		if !callbackAllowed(ap.Addr().Unmap(), allow) {
			return fmt.Errorf("%w: %s (see %s)", errCallbackAddr, ap.Addr(), flag)
		}
		return nil
	}
}

// callbackAllowed: public addresses, and others only when an allowed range
// holds them: loopback, private (the cluster's own network), carrier-grade
// NAT, link-local (cloud metadata), unspecified, broadcast and multicast
// ones are refused, and so is every address of the host's own interfaces,
// public ones too (brisk's listeners and whatever else serves there). A
// NAT64 address is also checked as the IPv4 address a NAT64 gateway would
// forward it to.
func callbackAllowed(a netip.Addr, allow []netip.Prefix) bool {
	if nat64.Contains(a) {
		b := a.As16()
		if !callbackAllowed(netip.AddrFrom4([4]byte(b[12:])), allow) {
			return false
		}
	}
	for _, p := range allow {
		if p.Contains(a) {
			return true
		}
	}
	return !(a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsUnspecified() || a.IsMulticast() ||
		slices.ContainsFunc(notPublic, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) }) || hostAddress(a))
}

// hostAddress reports whether a is an address of one of the host's
// interfaces (asked of the kernel at each dial: callbacks are few, and
// addresses come and go). When the kernel cannot say, it says yes: the
// callback is refused rather than sent somewhere unchecked.
func hostAddress(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if h, ok := netip.AddrFromSlice(n.IP); ok && h.Unmap() == a.Unmap() {
				return true
			}
		}
	}
	return false
}

var (
	// notPublic are the ranges beyond netip's tests that are no public
	// address: carrier-grade NAT (overlay networks; Alibaba Cloud's
	// metadata service is 100.100.100.200) and "this network".
	notPublic = []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("0.0.0.0/8"), netip.MustParsePrefix("255.255.255.255/32")}
	// nat64 is the well-known NAT64 prefix (RFC 6052).
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
)

// ValidCallbackURL checks a callback URL at submit: http or https with a
// host.
func ValidCallbackURL(s string) error {
	req, err := http.NewRequest(http.MethodPost, s, nil)
	if err != nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") || req.URL.Host == "" {
		return fmt.Errorf("X-Callback-Url %q: want an absolute http or https URL", s)
	}
	return nil
}

// callback POSTs a finished call's result to its callback URL with
// OpenFaaS's headers, retrying with back-off; it returns what to record.
func (q *Queue) callback(ctx context.Context, c *Call, rec *Record) string {
	res := rec.Result
	var last string
	delay := time.Second
	for try := 1; try <= q.cfg.CallbackAttempts; try++ {
		code, err := q.postCallback(ctx, c, rec, res)
		switch {
		case err == nil && code < 300:
			q.m.callbacks.WithLabelValues("delivered").Inc()
			return "delivered"
		case err != nil:
			last = err.Error()
			if errors.Is(err, errCallbackAddr) {
				try = q.cfg.CallbackAttempts // no point retrying
			}
		default:
			last = "callback answered " + strconv.Itoa(code)
		}
		if try == q.cfg.CallbackAttempts {
			break
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return "not delivered: " + last
		}
		delay *= 2
	}
	q.m.callbacks.WithLabelValues("failed").Inc()
	return "not delivered: " + last
}

func (q *Queue) postCallback(ctx context.Context, c *Call, rec *Record, res *Result) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.CallbackURL, bytes.NewReader(res.Body))
	if err != nil {
		return 0, err
	}
	if ct := res.Header.Get("Content-Type"); ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set("X-Call-Id", c.ID)
	req.Header.Set("X-Function-Name", c.Function)
	req.Header.Set("X-Function-Status", strconv.Itoa(res.Status))
	req.Header.Set("X-Duration-Seconds", strconv.FormatFloat(res.Seconds, 'f', 6, 64))
	req.Header.Set("X-Brisk-Call-Status", string(rec.Status))
	resp, err := q.hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}
