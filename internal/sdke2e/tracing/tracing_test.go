package tracing_test

// The tests here change OpenTelemetry's process-wide globals, so none of
// them runs in parallel.

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/internal/natstest"
	"github.com/retryd/retryd/internal/telemetry/telemetrytest"
	"github.com/retryd/retryd/pkg/tracing"
)

// A trace continues across a JetStream publish: the consumer span is the
// child of the producer span, found through the headers alone.
func TestTraceContinuesAcrossNATS(t *testing.T) {
	exp := telemetrytest.Record(t)
	srv := natstest.RunServer(t)
	nc, js := natstest.Connect(t, srv)
	natstest.EnsureStreams(t, js)
	sub, err := nc.SubscribeSync("retry.job.failed.j1")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	parent, root := otel.Tracer("test").Start(ctx, "worker attempt")
	msg := nats.NewMsg("retry.job.failed.j1")
	msg.Header.Set("Nats-Msg-Id", "job-failed:j1:1")
	msg.Data = []byte(`{}`)
	_, pub := tracing.StartPublish(parent, msg)
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	pub.End()
	root.End()

	got, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, msg.Header.Get("traceparent"), got.Header.Get("traceparent"))
	cctx, consume := tracing.StartConsume(ctx, got.Subject, "scheduler", got.Header, attribute.Int("retryd.attempt", 1))
	consume.End()

	spans := exp.GetSpans().Snapshots()
	require.Len(t, spans, 3)
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	p, c := byName["publish retry.job.failed.j1"], byName["process scheduler"]
	require.NotNil(t, p)
	require.NotNil(t, c)
	require.Equal(t, trace.SpanKindProducer, p.SpanKind())
	require.Equal(t, trace.SpanKindConsumer, c.SpanKind())
	require.Equal(t, root.SpanContext().TraceID(), c.SpanContext().TraceID())
	require.Equal(t, p.SpanContext().SpanID(), c.Parent().SpanID())
	require.True(t, c.Parent().IsRemote())
	require.Equal(t, c.SpanContext(), trace.SpanContextFromContext(cctx))
	attrs := map[attribute.Key]attribute.Value{}
	for _, a := range c.Attributes() {
		attrs[a.Key] = a.Value
	}
	require.Equal(t, "nats", attrs["messaging.system"].AsString())
	require.Equal(t, "retry.job.failed.j1", attrs["messaging.destination.name"].AsString())
	require.Equal(t, "scheduler", attrs["messaging.consumer.group.name"].AsString())
	require.Equal(t, "job-failed:j1:1", attrs["messaging.message.id"].AsString())
	require.Equal(t, int64(1), attrs["retryd.attempt"].AsInt64())
}

func TestExtractWithoutHeaders(t *testing.T) {
	telemetrytest.Record(t)
	ctx := tracing.Extract(context.Background(), nil)
	require.False(t, trace.SpanContextFromContext(ctx).IsValid())
	ctx = tracing.Extract(context.Background(), nats.Header{"traceparent": {"garbage"}})
	require.False(t, trace.SpanContextFromContext(ctx).IsValid())
	tracing.Inject(telemetrytest.RemoteParent(t), nil) // no panic on a message without headers
}

func TestTraceparentRoundTrip(t *testing.T) {
	t.Parallel()
	require.Empty(t, tracing.Traceparent(context.Background()), "no span, no traceparent")
	require.Equal(t, context.Background(), tracing.WithTraceparent(context.Background(), ""))

	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := tracing.WithTraceparent(context.Background(), tp)
	sc := trace.SpanContextFromContext(ctx)
	require.True(t, sc.IsValid())
	require.True(t, sc.IsRemote())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", sc.TraceID().String())
	require.Equal(t, tp, tracing.Traceparent(ctx))

	bad := tracing.WithTraceparent(context.Background(), "00-not-a-trace")
	require.False(t, trace.SpanContextFromContext(bad).IsValid())
}
