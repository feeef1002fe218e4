package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
)

// CallRecord is an asynchronous call's status (GET /v1/calls/ID).
type CallRecord = api.CallRecord

// InvokeAsync submits an asynchronous call (POST /async-function/NAME) and
// returns its call id once the data plane has stored it (202). A
// callbackURL, when set, receives the result.
func (c *Client) InvokeAsync(ctx context.Context, name, method string, body []byte, header http.Header, callbackURL string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Invoke+"/async-function/"+name, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if callbackURL != "" {
		req.Header.Set("X-Callback-Url", callbackURL)
	}
	c.authorize(req)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return "", fmt.Errorf("cannot reach the data plane at %s: %w", c.Invoke, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusAccepted {
		return "", replyError(resp.StatusCode, data)
	}
	return resp.Header.Get("X-Call-Id"), nil
}

// Call returns an asynchronous call's status and result.
func (c *Client) Call(ctx context.Context, id string) (*CallRecord, error) {
	var r CallRecord
	return &r, c.doAt(ctx, c.Invoke, "data plane", http.MethodGet, "/v1/calls/"+url.PathEscape(id), nil, &r)
}

// Calls lists asynchronous calls, newest first; empty filters match all.
func (c *Client) Calls(ctx context.Context, function, status string, limit int) ([]CallRecord, error) {
	q := url.Values{}
	if function != "" {
		q.Set("function", function)
	}
	if status != "" {
		q.Set("status", status)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out struct {
		Calls []CallRecord `json:"calls"`
	}
	return out.Calls, c.doAt(ctx, c.Invoke, "data plane", http.MethodGet, "/v1/calls?"+q.Encode(), nil, &out)
}

// RetryCall queues a failed or dead call again.
func (c *Client) RetryCall(ctx context.Context, id string) (*CallRecord, error) {
	var r CallRecord
	return &r, c.doAt(ctx, c.Invoke, "data plane", http.MethodPost, "/v1/calls/"+url.PathEscape(id)+"/retry", nil, &r)
}

// PurgeCalls drops the queued calls (dead: the dead letters) of function
// ("" = all) and returns how many.
func (c *Client) PurgeCalls(ctx context.Context, function string, dead bool) (uint64, error) {
	q := url.Values{}
	if function != "" {
		q.Set("function", function)
	}
	if dead {
		q.Set("dead", "true")
	}
	var out struct {
		Purged uint64 `json:"purged"`
	}
	return out.Purged, c.doAt(ctx, c.Invoke, "data plane", http.MethodDelete, "/v1/calls?"+q.Encode(), nil, &out)
}

// WaitCall polls an asynchronous call until it has finished (succeeded,
// failed or dead) or ctx ends, and returns its last record.
func (c *Client) WaitCall(ctx context.Context, id string) (*CallRecord, error) {
	return pollUntil(ctx, func() (*CallRecord, bool, error) {
		r, err := c.Call(ctx, id)
		return r, err == nil && r.Status.Final(), err
	})
}

// WaitReady polls a function until at least n of its sandboxes are ready
// or ctx ends (a watch for scripts: deploy, then wait). It fails at once,
// saying why, when n sandboxes would come only with calls (its min is
// below n and nothing asks for more: a function at min 0 has no sandbox
// until called, and is invocable all the same), and when the function is
// failing.
func (c *Client) WaitReady(ctx context.Context, name string, n int) (*api.FunctionView, error) {
	return pollUntil(ctx, func() (*api.FunctionView, bool, error) {
		v, err := c.Get(ctx, name)
		switch {
		case err != nil:
			return v, false, err
		case v.Status.Ready >= n:
			return v, true, nil
		case v.Function != nil && v.Function.Scaling.Min < n && v.Status.Desired < n:
			return v, false, fmt.Errorf("function %s will not have %d ready sandboxes without calls: its min is %d and %d are wanted now (it is invocable: a call starts one)",
				name, n, v.Function.Scaling.Min, v.Status.Desired)
		case v.Status.Condition == "function-failing":
			return v, false, fmt.Errorf("function %s is failing: %s", name, v.Status.Message)
		}
		return v, false, nil
	})
}

// pollUntil calls get, backing off from 10 ms to 1 s, until it reports
// done, fails, or ctx ends (then with the last value).
func pollUntil[T any](ctx context.Context, get func() (T, bool, error)) (T, error) {
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		v, done, err := get()
		if err != nil || done {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// LogOptions select the logs Logs returns.
type LogOptions struct {
	Tail    int    // the function's last lines, of all its sandboxes; 0: all that is kept
	Since   string // a duration ("10m") or an RFC 3339 time
	Sandbox string // one sandbox's only
	Follow  bool   // keep streaming new lines until ctx ends
}

// Logs calls fn with each line of a function's sandboxes' output, gathered
// from its workers, until they have all been sent (or, with Follow, until
// ctx ends or fn returns an error).
func (c *Client) Logs(ctx context.Context, name string, o LogOptions, fn func(api.LogLine) error) error {
	q := url.Values{}
	if o.Tail > 0 {
		q.Set("tail", strconv.Itoa(o.Tail))
	}
	if o.Since != "" {
		q.Set("since", o.Since)
	}
	if o.Sandbox != "" {
		q.Set("sandbox", o.Sandbox)
	}
	if o.Follow {
		q.Set("follow", "true")
	}
	hc := *c.HTTP
	hc.Timeout = 0 // a followed stream lasts as long as ctx
	resp, _, err := c.sendAdmin(ctx, &hc, http.MethodGet, "/v1/functions/"+url.PathEscape(name)+"/logs?"+q.Encode(), nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return replyError(resp.StatusCode, data)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var l api.LogLine
		if err := dec.Decode(&l); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := fn(l); err != nil {
			return err
		}
	}
}
