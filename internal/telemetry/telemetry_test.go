package telemetry_test

// The tests here change OpenTelemetry's process-wide globals, so none of
// them runs in parallel.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/retryd/retryd/internal/telemetry"
	"github.com/retryd/retryd/internal/telemetry/telemetrytest"
	"github.com/retryd/retryd/pkg/tracing"
)

func TestSetupWithoutEndpointInstallsNothing(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tp, prop := otel.GetTracerProvider(), otel.GetTextMapPropagator()

	shutdown, err := telemetry.Setup(context.Background(), "retryd-test", zerolog.Nop())
	require.NoError(t, err)
	require.NoError(t, shutdown(context.Background()))

	require.False(t, telemetry.Enabled())
	require.Same(t, tp, otel.GetTracerProvider())
	require.Equal(t, prop, otel.GetTextMapPropagator())
	require.Empty(t, otel.GetTextMapPropagator().Fields())
	// A span in ctx (e.g. from an embedding program) is not written out.
	h := nats.Header{}
	tracing.Inject(telemetrytest.RemoteParent(t), h)
	require.Empty(t, h)
	_, span := tracing.StartConsume(context.Background(), "retry.job.failed.j1", "scheduler", h)
	require.False(t, span.IsRecording())
	span.End()
}
func TestSetupExportsToEndpoint(t *testing.T) {
	var (
		mu       sync.Mutex
		requests []*coltrace.ExportTraceServiceRequest
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/traces" || err != nil {
			http.Error(w, "unexpected", http.StatusBadRequest)
			return
		}
		req := &coltrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		requests = append(requests, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_SERVICE_NAME", "renamed")
	t.Cleanup(func() { tracing.Install(sdktrace.NewTracerProvider())() })

	ctx := context.Background()
	shutdown, err := telemetry.Setup(ctx, "retryd-test", zerolog.Nop())
	require.NoError(t, err)
	msg := nats.NewMsg("retry.job.failed.j1")
	msg.Header.Set("Nats-Msg-Id", "job-failed:j1:1")
	_, span := tracing.StartPublish(ctx, msg)
	span.End()
	require.NotEmpty(t, msg.Header.Get("traceparent"))
	require.NoError(t, shutdown(ctx)) // flushes the batch

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, requests, 1)
	rs := requests[0].GetResourceSpans()
	require.Len(t, rs, 1)
	var service string
	for _, a := range rs[0].GetResource().GetAttributes() {
		if a.GetKey() == "service.name" {
			service = a.GetValue().GetStringValue()
		}
	}
	require.Equal(t, "renamed", service)
	spans := rs[0].GetScopeSpans()[0].GetSpans()
	require.Len(t, spans, 1)
	require.Equal(t, "publish retry.job.failed.j1", spans[0].GetName())
}
func TestHandlerContinuesTrace(t *testing.T) {
	exp := telemetrytest.Record(t)
	mux := http.NewServeMux()
	var inner trace.SpanContext
	mux.HandleFunc("GET /v1/retries/{kind}/{id}", func(w http.ResponseWriter, r *http.Request) {
		inner = trace.SpanContextFromContext(r.Context())
	})
	mux.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) {})
	h := telemetry.Handler(mux, "retryd-scheduler")

	req := httptest.NewRequest(http.MethodGet, "/v1/retries/job/j1", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/healthz", nil))

	spans := exp.GetSpans().Snapshots()
	require.Len(t, spans, 1, "health checks are not traced")
	require.Equal(t, "GET /v1/retries/{kind}/{id}", spans[0].Name())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", spans[0].SpanContext().TraceID().String())
	require.Equal(t, spans[0].SpanContext(), inner)
}
