// Package telemetry sets up OpenTelemetry tracing in retryd's binaries:
// Setup installs an OTLP/HTTP exporter when OTEL_EXPORTER_OTLP_ENDPOINT
// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, Flush drains it at
// shutdown, and Handler traces an HTTP server.
//
// It is kept apart from pkg/tracing, which only propagates trace context
// through the OpenTelemetry API, because the SDK, the exporter and their
// transitive dependencies must not reach programs that import the worker
// SDK.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/retryd/retryd/pkg/tracing"
)

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
	tracing.Install(tp)
	log.Info().Str("service_name", serviceName).Msg("tracing enabled (OTLP/HTTP)")
	return tp.Shutdown, nil
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
