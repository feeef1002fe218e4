package trigger

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/net/http/httpguts"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/proxy"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// NATS triggers: each runs in its own goroutine with its own subscription
// (on the cluster's connection, or on a connection of its own to an
// external server), and queues every message as a call through Workers
// goroutines. With a stream, a durable JetStream consumer named
// brisk-UID delivers the messages, and a message is acknowledged only
// once the queue has its call: at least once, and a message delivered
// again (after a crash) keeps its call id, which the queue's duplicate
// window stores once. Without one, a core NATS queue subscription (group
// brisk-UID, so that a control plane taking over never doubles a message
// with one still stopping) delivers messages at most once.

// startNATS starts j's subscription; the caller may hold r.mu.
func (r *Runner) startNATS(ctx context.Context, j *job) {
	jctx, cancel := context.WithCancel(ctx)
	j.stop, j.done = cancel, make(chan struct{})
	go r.runNATS(jctx, j)
}

// stopNATS ends j's subscription, deleting its durable consumer when the
// trigger is gone (remove).
func (r *Runner) stopNATS(j *job, remove bool) {
	if j.stop == nil {
		return
	}
	j.remove.Store(remove)
	j.stop()
	<-j.done
}

// runNATS subscribes until ctx ends, again after failures with back-off.
func (r *Runner) runNATS(ctx context.Context, j *job) {
	defer close(j.done)
	backoff := 500 * time.Millisecond
	for {
		err := r.subscribe(ctx, j)
		if ctx.Err() != nil {
			return
		}
		j.stats.fail(err)
		r.log.Warn("NATS trigger not subscribed", "trigger", j.e.Key(), "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-r.clk.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// subscribe runs one subscription until ctx ends (nil) or it fails.
func (r *Runner) subscribe(ctx context.Context, j *job) error {
	n := j.e.Trigger.NATS
	nc, own, err := r.conn(j)
	if err != nil {
		return err
	}
	if own {
		defer nc.Close()
	}
	// work is never closed: a JetStream handler may still be running when
	// the subscription stops. Workers and handlers leave on wctx instead;
	// a stored message handed over but not run is handed back (Nak), so
	// JetStream delivers it again at once.
	work := make(chan func(), r.cfg.Workers)
	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range r.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case f := <-work:
					f()
				case <-wctx.Done():
					for {
						select {
						case f := <-work:
							f() // ctx has ended: hands a stored message back
						default:
							return
						}
					}
				}
			}
		})
	}
	defer func() { stopWorkers(); wg.Wait() }()
	uid := j.e.Trigger.UID
	if n.Stream == "" {
		ch := make(chan *nats.Msg, 8192)
		sub, err := nc.ChanQueueSubscribe(n.Subject, "brisk-"+uid, ch)
		if err != nil {
			return fmt.Errorf("subscribing to %q: %w", n.Subject, err)
		}
		defer sub.Unsubscribe()
		j.stats.clearErr()
		for {
			select {
			case <-ctx.Done():
				return nil
			case m := <-ch:
				f := func() {
					if ctx.Err() != nil {
						return // stopping: a core message is not kept
					}
					id := CallIDPrefix + uid + "-" + randomHex(8)
					if err := r.submitMessage(ctx, j, id, false, m.Subject, m.Header, m.Data); err != nil {
						j.stats.fail(err)
					}
				}
				select {
				case work <- f:
				case <-ctx.Done():
					return nil
				}
			}
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, n.Stream)
	if err != nil {
		return fmt.Errorf("JetStream stream %q: %w", n.Stream, err)
	}
	durable := "brisk-" + uid
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       durable,
		Description:   "brisk trigger " + j.e.Key(),
		FilterSubject: n.Subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 4 * r.cfg.Workers,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return fmt.Errorf("durable consumer %s on stream %q: %w", durable, n.Stream, err)
	}
	j.stats.clearErr()
	// A message this runner takes but will not run (it is stopping) is
	// handed back at once, not after the ack wait: the next leader's
	// consumer gets it now. Pull requests expire in 5 s, so those of a
	// stopped runner soon stop taking messages.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case work <- func() { r.deliverStored(ctx, j, m) }:
		case <-wctx.Done():
			_ = m.Nak()
		}
	}, jetstream.PullMaxMessages(2*r.cfg.Workers), jetstream.PullExpiry(5*time.Second), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			j.stats.fail(err)
		}
	}))
	if err != nil {
		return fmt.Errorf("consuming stream %q: %w", n.Stream, err)
	}
	<-ctx.Done()
	// Drain, not Stop: the messages already here reach the handler, which
	// hands them back; and once the subscription is gone (Closed) and the
	// server has seen that (Flush), it drops this runner's pull requests
	// instead of sending them messages no one reads until the ack wait.
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-time.After(5 * time.Second):
	}
	_ = nc.FlushTimeout(5 * time.Second)
	if j.remove.Load() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteConsumer(dctx, n.Stream, durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.log.Warn("durable consumer of a deleted trigger not deleted", "trigger", j.e.Key(), "consumer", durable, "err", err)
		}
	}
	return nil
}

// deliverStored queues a JetStream message's call and acknowledges the
// message once the queue has it.
func (r *Runner) deliverStored(ctx context.Context, j *job, m jetstream.Msg) {
	if ctx.Err() != nil { // stopping: the next runner delivers it
		_ = m.Nak()
		return
	}
	md, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		j.stats.fail(err)
		return
	}
	id := MessageCallID(j.e.Trigger.UID, md.Sequence.Stream)
	err = r.submitMessage(ctx, j, id, true, m.Subject(), m.Headers(), m.Data())
	switch {
	case err == nil:
		_ = m.Ack()
		r.lag.observe(spec.TriggerNATS, r.clk.Now().Sub(md.Timestamp))
	case permanent(err):
		_ = m.Term() // never fits: delivering it again would not either
		j.stats.fail(err)
	default:
		_ = m.NakWithDelay(time.Second)
		j.stats.fail(err)
	}
}

// submitMessage queues a message's call: its body, and its headers but
// NATS's own and those HTTP gives a meaning of their own.
func (r *Runner) submitMessage(ctx context.Context, j *job, id string, dedupe bool, subject string, mh nats.Header, data []byte) error {
	t := &j.e.Trigger
	h := make(http.Header, len(mh)+2)
	for k, vs := range mh {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if strings.HasPrefix(ck, "Nats-") || proxy.HopByHop(ck) || droppedHeader[ck] || !httpguts.ValidHeaderFieldName(ck) {
			continue
		}
		for _, v := range vs {
			if httpguts.ValidHeaderFieldValue(v) {
				h[ck] = append(h[ck], v)
			}
		}
	}
	addHeaders(h, t.Headers, id, r.clk.Now())
	h["X-Brisk-Trigger"] = []string{j.e.Key()}
	h["X-Brisk-Subject"] = []string{subject}
	c := &async.Call{ID: id, Function: t.Function, Method: http.MethodPost, Path: cmp.Or(t.Path, "/"), Header: h, Body: data,
		Host: "brisk-trigger", FunctionUID: t.FunctionUID, Fresh: true, Dedupe: dedupe}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.cfg.Queue.Submit(sctx, c); err != nil {
		return fmt.Errorf("queueing a message of %s: %w", subject, err)
	}
	j.stats.ok()
	return nil
}

// droppedHeader: headers of a message that do not become the call's,
// beyond the hop-by-hop ones: HTTP's framing and brisk's own.
var droppedHeader = map[string]bool{
	"Content-Length": true, "Host": true, "Authorization": true, "X-Call-Id": true, "X-Callback-Url": true, "Prefer": true,
}

// conn is the connection j subscribes on: the cluster's, or its own to
// its external server (own: the caller closes it).
func (r *Runner) conn(j *job) (nc *nats.Conn, own bool, err error) {
	n := j.e.Trigger.NATS
	if n.URL == "" {
		if r.cfg.NATS == nil {
			return nil, false, errors.New("this control plane has no NATS connection (brisk controlplane --nats): NATS triggers without a url cannot run")
		}
		return r.cfg.NATS, false, nil
	}
	opts := []nats.Option{
		nats.Name("brisk trigger " + j.e.Key()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.Timeout(5 * time.Second),
		nats.SetCustomDialer(&net.Dialer{Timeout: 5 * time.Second, Control: async.PublicOnly(r.cfg.OutboundAllow, "--trigger-nats-allow")}),
	}
	if n.CredentialsSecret != "" {
		ns := spec.TriggerNamespace(&j.e.Trigger)
		var v []byte
		ok := false
		if r.cfg.Secret != nil {
			v, ok = r.cfg.Secret(ns, n.CredentialsSecret)
		}
		if !ok {
			return nil, false, fmt.Errorf("credentials secret %q not found in namespace %q", n.CredentialsSecret, ns)
		}
		o, err := credentials(v)
		if err != nil {
			return nil, false, fmt.Errorf("credentials secret %q: %w", n.CredentialsSecret, err)
		}
		opts = append(opts, o)
	}
	nc, err = nats.Connect(n.URL, opts...)
	if err != nil {
		return nil, false, fmt.Errorf("connecting to %s: %w", n.URL, err)
	}
	return nc, true, nil
}

// credentials reads a credentials secret: a .creds file (a user JWT and
// its nkey seed), "user:password", or a token.
func credentials(v []byte) (nats.Option, error) {
	s := strings.TrimSpace(string(v))
	switch {
	case s == "":
		return nil, errors.New("empty")
	case strings.Contains(s, "BEGIN NATS USER JWT"):
		jwt, err := natsjwt.ParseDecoratedJWT(v)
		if err != nil {
			return nil, fmt.Errorf("reading its JWT: %w", err)
		}
		kp, err := natsjwt.ParseDecoratedNKey(v)
		if err != nil {
			return nil, fmt.Errorf("reading its seed: %w", err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, fmt.Errorf("reading its seed: %w", err)
		}
		return nats.UserJWTAndSeed(jwt, string(seed)), nil
	case strings.Contains(s, ":") && !strings.ContainsAny(s, "\r\n"):
		user, pass, _ := strings.Cut(s, ":")
		return nats.UserInfo(user, pass), nil
	}
	return nats.Token(s), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
