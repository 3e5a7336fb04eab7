package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
)

// The scheduler stores the trace context of the decision that scheduled a
// retry with its row, so the due event published minutes or days later
// continues that trace instead of starting one of its own. These two use
// the W3C format directly rather than the installed propagator: the value
// is data in a database column, readable by any later process whatever
// its own tracing set-up.

// Traceparent returns the W3C traceparent of the span in ctx, or "" when
// ctx holds no valid span context.
func Traceparent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c.Get("traceparent")
}

// WithTraceparent returns ctx carrying the remote span context of the W3C
// traceparent tp, so spans started from it join that trace. An empty or
// malformed tp returns ctx unchanged.
func WithTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}
