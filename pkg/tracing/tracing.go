// Package tracing is retryd's OpenTelemetry tracing: Setup installs an
// OTLP/HTTP exporter when OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, and the helpers carry the
// W3C trace context (traceparent, tracestate, baggage) in NATS message
// headers so a retry's trace continues from the failed event through the
// scheduler to the scheduled event and beyond.
//
// Without the variable nothing is installed: the global no-op tracer
// provider and propagator stay, spans cost nothing and no header is
// written.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// instrumentation is the tracer name of every retryd span.
const instrumentation = "github.com/retryd/retryd"

// Enabled reports whether the environment asks for tracing.
func Enabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the global tracer provider and propagator when Enabled.
// The exporter reads the standard OTEL_EXPORTER_OTLP_* variables (endpoint,
// headers, timeout, TLS) and the sampler OTEL_TRACES_SAMPLER(_ARG);
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override serviceName and
// add attributes. shutdown flushes the spans still batched; call it last,
// after the consumers have stopped. When tracing is disabled shutdown does
// nothing.
func Setup(ctx context.Context, serviceName string, log zerolog.Logger) (shutdown func(context.Context) error, err error) {
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("create otlp exporter: %w", err)
	}
	// Later detectors win: the environment overrides the built-in name.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, errors.Join(fmt.Errorf("build trace resource: %w", err), exp.Shutdown(ctx))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	Install(tp)
	log.Info().Str("service_name", serviceName).Msg("tracing enabled (OTLP/HTTP)")
	return tp.Shutdown, nil
}

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

// flushTimeout bounds Flush: a collector that does not answer must not
// hold up a shutdown.
const flushTimeout = 5 * time.Second

// Flush calls shutdown (from Setup) with a bounded context and logs a
// failure; binaries defer it first so it runs last.
func Flush(shutdown func(context.Context) error, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		log.Warn().Err(err).Msg("flush traces")
	}
}
