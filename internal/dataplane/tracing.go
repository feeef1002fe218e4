package dataplane

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// A traced call (Config.Tracer) is one server span, "invoke NAME", child of
// the caller's W3C traceparent when it sent one, and parent of the
// function's: the request goes on with the data plane's traceparent. Its
// children are laid out from the times the data plane keeps anyway
// (reqState), after the call:
//
//	queue        arrival -> a sandbox slot
//	cold start   the sandbox the call waited for: placement (the control
//	             plane's decision and dispatch), creation and readiness on
//	             the worker; laid out to end when the endpoint reached this
//	             data plane, from the durations the endpoint stream carries
//	first byte   request sent to the sandbox -> its reply head
//
// The control plane and worker measure the cold-start phases on their own
// clocks; only durations cross machines, so the layout is exact in length
// and approximate in position by the link's latency.

var traceProp = propagation.TraceContext{}

// invokeTraced runs invoke inside the call's span.
func (d *DataPlane) invokeTraced(w http.ResponseWriter, r *http.Request, rt route) {
	ctx := traceProp.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := d.cfg.Tracer.Start(ctx, "invoke "+rt.name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("faas.name", rt.name), attribute.String("http.request.method", r.Method)))
	defer span.End()
	// The function continues the trace under the data plane's span.
	traceProp.Inject(ctx, propagation.HeaderCarrier(r.Header))
	sw := &statusWriter{ResponseWriter: w}
	d.invoke(sw, r.WithContext(ctx), rt)
	if sw.code != 0 { // calls refused before admission have no traceCall
		span.SetAttributes(attribute.Int("http.response.status_code", sw.code))
		if sw.code >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.code))
		}
	}
}

// statusWriter notes the status a traced call was answered with. Unwrap
// keeps http.ResponseController (deadlines, flushes, full duplex) working.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 && code >= 200 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// wall converts a nanotime to wall-clock time.
func (d *DataPlane) wall(ns int64) time.Time { return time.Unix(0, d.epochNs+ns) }

// spanAt records a finished span from..to (nanotimes) under parent and
// returns its context, for children.
func (d *DataPlane) spanAt(parent context.Context, name string, from, to int64, attrs ...attribute.KeyValue) context.Context {
	ctx, s := d.cfg.Tracer.Start(parent, name, trace.WithTimestamp(d.wall(from)), trace.WithAttributes(attrs...))
	s.End(trace.WithTimestamp(d.wall(to)))
	return ctx
}

// traceCall records a finished (or refused) call's phases under its span.
func (d *DataPlane) traceCall(st *reqState, code int, end int64) {
	span := trace.SpanFromContext(st.Context)
	if !span.IsRecording() {
		return
	}
	ctx := trace.ContextWithSpan(context.Background(), span)
	span.SetAttributes(attribute.String("brisk.function", st.fn.name), attribute.Int("http.response.status_code", code),
		attribute.Bool("faas.coldstart", st.cold))
	if st.conf != nil {
		span.SetAttributes(attribute.Int64("brisk.revision", int64(st.conf.revision)))
	}
	if code >= 500 {
		span.SetStatus(codes.Error, http.StatusText(code))
	}
	if st.ep == nil { // no slot: the whole call was queueing
		d.spanAt(ctx, "queue", st.arrival, end)
		return
	}
	span.SetAttributes(attribute.String("brisk.sandbox", st.ep.id))
	d.spanAt(ctx, "queue", st.arrival, st.arrival+st.queueNs, attribute.Bool("faas.coldstart", st.cold))
	if ep := st.ep; st.cold && ep.createUs > 0 && ep.startUs >= 0 && ep.startUs <= ep.createUs && ep.readyAfterUs >= ep.createUs {
		us := int64(time.Microsecond)
		startAt := ep.added - ep.readyAfterUs*us
		link := (ep.readyAfterUs - ep.createUs) * us // dispatch + report back
		cold := d.spanAt(ctx, "cold start", startAt, ep.added, attribute.String("brisk.sandbox", ep.id))
		created := startAt + link/2
		d.spanAt(cold, "placement", startAt, created)
		d.spanAt(cold, "creation", created, created+ep.startUs*us)
		d.spanAt(cold, "readiness", created+ep.startUs*us, created+ep.createUs*us)
	}
	if st.firstByte > 0 {
		d.spanAt(ctx, "first byte", st.proxyStart, st.firstByte)
	}
}
