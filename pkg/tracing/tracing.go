// Package tracing carries retryd's OpenTelemetry traces across NATS: the
// helpers put the W3C trace context (traceparent, tracestate, baggage) in
// message headers and start producer and consumer spans, so a retry's
// trace continues from the failed event through the scheduler to the
// scheduled event and beyond.
//
// It uses the OpenTelemetry API only (the global tracer provider and
// propagator), never the SDK or an exporter: the worker SDK imports it,
// and a program that embeds a worker decides how, or whether, spans are
// exported. retryd's own binaries install an exporter with
// internal/telemetry.Setup. Until something is installed the global no-op
// provider and propagator stay, spans cost nothing and no header is
// written.
package tracing

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// instrumentation is the tracer name of every retryd span.
const instrumentation = "github.com/retryd/retryd"

// Install makes tp the global tracer provider and W3C trace context plus
// baggage the global propagator. It is for programs that build their own
// provider (another exporter, a sampler) and for tests with an in-memory
// exporter. uninstall puts no-op ones back (not the previous globals:
// OpenTelemetry's default globals delegate to the first provider ever
// set). The globals are process-wide, so tests using Install must not run
// in parallel with tests that trace.
func Install(tp trace.TracerProvider) (uninstall func()) {
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	}
}
