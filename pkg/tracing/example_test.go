package tracing_test

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/pkg/tracing"
)

// The trace context travels in W3C headers next to Nats-Msg-Id.
func ExampleInject() {
	uninstall := tracing.Install(sdktrace.NewTracerProvider())
	defer uninstall()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
	}))

	msg := nats.NewMsg("retry.job.failed.j1")
	tracing.Inject(ctx, msg.Header)
	fmt.Println(msg.Header.Get("traceparent"))

	consumer, span := tracing.StartConsume(context.Background(), msg.Subject, "scheduler", msg.Header)
	defer span.End()
	fmt.Println(trace.SpanContextFromContext(consumer).TraceID())
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// 4bf92f3577b34da6a3ce929d0e0e4736
}
