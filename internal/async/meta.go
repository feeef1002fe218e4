package async

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A submit is the accept path's hot spot: encoding/json's reflection on
// the call's head and the JetStream client's publish (a context, a reply
// decoded with encoding/json) were a quarter of the queue's CPU per
// submit (BenchmarkSubmitFresh). The head is appended by hand and the
// store's acknowledgement is read by hand when it is the usual one; the
// consumer still decodes the head with encoding/json, which TestMetaJSON
// holds the encoder to.

// appendJSON appends m as encoding/json would encode it, up to the order
// of the header map's keys and the escaping of <, > and &.
func (m *callMeta) appendJSON(b []byte) []byte {
	b = append(b, `{"m":`...)
	b = appendJSONString(b, m.Method)
	b = append(b, `,"p":`...)
	b = appendJSONString(b, m.Path)
	if m.Query != "" {
		b = append(b, `,"q":`...)
		b = appendJSONString(b, m.Query)
	}
	if len(m.Header) > 0 {
		b = append(b, `,"h":{`...)
		first := true
		for k, vs := range m.Header {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendJSONString(b, k)
			if vs == nil {
				b = append(b, ":null"...)
				continue
			}
			b = append(b, ":["...)
			for i, v := range vs {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, v)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	if m.Callback != "" {
		b = append(b, `,"cb":`...)
		b = appendJSONString(b, m.Callback)
	}
	b = append(b, `,"t":`...)
	b = strconv.AppendInt(b, m.Submit, 10)
	if m.Host != "" {
		b = append(b, `,"host":`...)
		b = appendJSONString(b, m.Host)
	}
	if m.Remote != "" {
		b = append(b, `,"ra":`...)
		b = appendJSONString(b, m.Remote)
	}
	if m.UID != "" {
		b = append(b, `,"u":`...)
		b = appendJSONString(b, m.UID)
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD as
// encoding/json does.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// publishTimeout bounds a store whose context has no deadline, as the
// JetStream client's default does.
const publishTimeout = 5 * time.Second

// publish stores msg in its stream and waits for the acknowledgement. As
// the JetStream client does, it tries again, twice, 250 ms apart, when no
// server answers for the stream: a moment without one (a stream leader
// changing, a server restarting) is not an error the client should see.
func (q *Queue) publish(ctx context.Context, msg *nats.Msg) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, publishTimeout)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		reply, err := q.nc.RequestMsgWithContext(ctx, msg)
		switch {
		case errors.Is(err, nats.ErrNoResponders) && attempt < jetstream.DefaultPubRetryAttempts:
			t := time.NewTimer(jetstream.DefaultPubRetryWait)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return jetstream.ErrNoStreamResponse
			}
		case errors.Is(err, nats.ErrNoResponders):
			return jetstream.ErrNoStreamResponse
		case err != nil:
			return err
		}
		return pubAckErr(reply.Data)
	}
}

// pubAckErr reads a JetStream acknowledgement: nil for a stored message
// (or a duplicate), the API error otherwise.
func pubAckErr(data []byte) error {
	// The usual reply, {"stream":"NAME","seq":N[,"duplicate":true]},
	// names no error: no need to decode it.
	const usual = `{"stream":"`
	if len(data) > len(usual) && bytes.HasPrefix(data, []byte(usual)) && !bytes.Contains(data, []byte(`"error"`)) {
		return nil
	}
	var ack struct {
		Error  *jetstream.APIError `json:"error,omitempty"`
		Stream string              `json:"stream"`
	}
	if err := json.Unmarshal(data, &ack); err != nil {
		return fmt.Errorf("%w: %v", jetstream.ErrInvalidJSAck, err)
	}
	if ack.Error != nil {
		return ack.Error
	}
	if ack.Stream == "" {
		return jetstream.ErrInvalidJSAck
	}
	return nil
}
