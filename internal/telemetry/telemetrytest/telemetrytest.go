// Package telemetrytest is test support for traces: a tracer provider
// recording in memory, and a remote parent span to continue. It links the
// OpenTelemetry SDK, so only tests import it (the SDK packages must not:
// pkg/worker's dependency test).
package telemetrytest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/pkg/tracing"
)

// Remote parent span ids, as an upstream service would send them.
const (
	RemoteTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	RemoteSpanID  = "00f067aa0ba902b7"
)

// Record installs a tracer provider recording into an in-memory exporter
// until the test ends.
func Record(t testing.TB) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	uninstall := tracing.Install(tp)
	t.Cleanup(func() {
		uninstall()
		require.NoError(t, tp.Shutdown(context.Background()))
	})
	return exp
}

// RemoteParent is a context holding a sampled remote span
// (RemoteTraceID, RemoteSpanID).
func RemoteParent(t testing.TB) context.Context {
	t.Helper()
	tid, err := trace.TraceIDFromHex(RemoteTraceID)
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex(RemoteSpanID)
	require.NoError(t, err)
	return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true,
	}))
}
