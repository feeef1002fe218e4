package async

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The hand-written publish (meta.go) keeps what the JetStream client's did.

// The JetStream client's PublishMsg, which Submit used, asks again twice
// (250 ms apart) when a publish finds no responders — "to protect against
// small blips in leadership changes" (nats.go jetstream/publish.go). The
// hand-written publish fails at once: a stream that is briefly without a
// responder (a leader election on a 3-replica cluster, a restarting
// server) turns submits into 503s that the client library rode out.
func TestSubmitRidesOutANoResponderBlip(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	ctx := context.Background()
	// Control: the JetStream client rides out the same blip.
	for _, viaClient := range []bool{true, false} {
		if err := e.q.js.DeleteStream(ctx, CallsStream); err != nil {
			t.Fatal(err)
		}
		back := make(chan error, 1)
		go func() {
			time.Sleep(100 * time.Millisecond)
			_, err := Open(ctx, e.q.nc, Config{}) // the stream is back
			back <- err
		}()
		var err error
		if viaClient {
			msg := &nats.Msg{Subject: callsPrefix + "fn.client-1", Header: nats.Header{hdrCall: {`{"m":"POST","p":"/","t":1}`}}, Data: []byte("x")}
			_, err = e.q.js.PublishMsg(ctx, msg)
		} else {
			err = e.q.Submit(ctx, &Call{ID: "fresh-1", Function: "fn", Method: http.MethodPost, Path: "/", Body: []byte("x"), Fresh: true})
		}
		if oerr := <-back; oerr != nil {
			t.Fatal(oerr)
		}
		if err != nil {
			t.Errorf("via the JetStream client %v: the publish during a 100 ms blip failed: %v", viaClient, err)
		}
	}
}

// A submit whose context ends (the client left, the data plane stops)
// stops waiting for the acknowledgement, rather than waiting out its
// timeout (5 s).
func TestSubmitStopsWaitingWhenItsContextEnds(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	// A stream that never answers: a responder that stays silent.
	if err := e.q.js.DeleteStream(context.Background(), CallsStream); err != nil {
		t.Fatal(err)
	}
	sub, err := e.q.nc.Subscribe(callsPrefix+">", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	t0 := time.Now()
	err = e.q.Submit(ctx, &Call{ID: "fresh-2", Function: "fn", Method: http.MethodPost, Path: "/", Body: []byte("x"), Fresh: true})
	if err == nil {
		t.Fatal("stored without a stream")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Submit returned %v after %v, not its context's end", err, time.Since(t0))
	}
}
