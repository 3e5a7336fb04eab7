package scheduler_test

// These tests install a global tracer provider, so they do not call
// t.Parallel: Go runs them before any parallel test starts, and nothing
// else in this package sees the provider.

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/telemetry"
	"github.com/retryd/retryd/internal/telemetry/telemetrytest"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/retrystore"
)

const (
	ownerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	ownerSpanID  = "00f067aa0ba902b7"
)

// traceparent parses a W3C traceparent header into trace and span id.
func traceparent(t *testing.T, v string) (traceID, spanID string) {
	t.Helper()
	parts := strings.Split(v, "-")
	require.Len(t, parts, 4, "traceparent %q", v)
	return parts[1], parts[2]
}

func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string, match func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	for _, s := range exp.GetSpans() {
		if s.Name == name && match(s) {
			return s
		}
	}
	t.Fatalf("no span %q among %d", name, len(exp.GetSpans()))
	return tracetest.SpanStub{}
}

// A failed event published with a traceparent continues its trace
// through the scheduler's consumer span and the outbox into the
// scheduled event, and through the row into the due event.
func TestTraceFromFailedToScheduled(t *testing.T) {
	exp := telemetrytest.Record(t)
	b := setup(t)
	b.start(t)
	b.policy(t, "traced", "", 3, 50, 1000)

	msg := lifecycleMsg(t, contract.Failed, failed("traced", "t1", 1, "timeout"))
	msg.Header.Set("traceparent", "00-"+ownerTraceID+"-"+ownerSpanID+"-01")
	_, err := b.js.PublishMsg(b.ctx, msg)
	require.NoError(t, err)
	b.waitRow(t, "traced", "t1", func(r retrystore.Retry) bool { return r.State == retrystore.StateDue })

	var scheduled, due jetstream.Msg
	require.Eventually(t, func() bool {
		for _, m := range b.streamMsgs(t, "retry.traced.>") {
			switch {
			case strings.HasPrefix(m.Subject(), "retry.traced.scheduled."):
				scheduled = m
			case strings.HasPrefix(m.Subject(), "retry.traced.due."):
				due = m
			}
		}
		return scheduled != nil && due != nil
	}, waitFor, 20*time.Millisecond)

	traceID, parentID := traceparent(t, scheduled.Headers().Get("traceparent"))
	require.Equal(t, ownerTraceID, traceID, "scheduled continues the failure's trace")
	consume := spanNamed(t, exp, "process scheduler", func(s tracetest.SpanStub) bool {
		return s.SpanContext.TraceID().String() == ownerTraceID
	})
	require.Equal(t, trace.SpanKindConsumer, consume.SpanKind)
	require.Equal(t, ownerSpanID, consume.Parent.SpanID().String())
	require.Equal(t, consume.SpanContext.SpanID().String(), parentID, "scheduled is written under the consumer span")

	// The row keeps the decision's trace context, and the due event,
	// published later by the due loop, continues the same trace under a
	// producer span whose parent is the decision's consumer span.
	row, err := retrystore.Get(b.ctx, b.pool, "traced", "t1")
	require.NoError(t, err)
	require.Equal(t, scheduled.Headers().Get("traceparent"), row.TraceContext)
	dueTrace, dueParent := traceparent(t, due.Headers().Get("traceparent"))
	require.Equal(t, ownerTraceID, dueTrace, "due continues the failure's trace")
	publish := spanNamed(t, exp, "publish "+due.Subject(), func(s tracetest.SpanStub) bool { return true })
	require.Equal(t, trace.SpanKindProducer, publish.SpanKind)
	require.Equal(t, ownerTraceID, publish.SpanContext.TraceID().String())
	require.Equal(t, consume.SpanContext.SpanID().String(), publish.Parent.SpanID().String())
	require.Equal(t, publish.SpanContext.SpanID().String(), dueParent)
}

// A cancel through the traced API carries the request's trace into the
// cancelled event.
func TestTraceFromAPIToCancelled(t *testing.T) {
	telemetrytest.Record(t)
	b := setup(t)
	s := b.start(t)
	b.policy(t, "traced", "", 3, 60_000, 60_000)
	b.failTo(t, "traced", "t2", 1, "timeout", retrystore.StateScheduled)

	h := telemetry.Handler(serve.Guard{}.Handler(s.Handler()), "retryd-scheduler")
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/v1/retries/traced/t2/cancel", strings.NewReader(`{"reason":"test"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+ownerTraceID+"-"+ownerSpanID+"-01")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())

	var cancelled jetstream.Msg
	require.Eventually(t, func() bool {
		for _, m := range b.streamMsgs(t, "retry.traced.cancelled.t2") {
			cancelled = m
		}
		return cancelled != nil
	}, waitFor, 20*time.Millisecond)
	traceID, _ := traceparent(t, cancelled.Headers().Get("traceparent"))
	require.Equal(t, ownerTraceID, traceID)
}
