package outbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/retryd/retryd/pkg/tracing"
)

// Not parallel: it installs a global tracer provider, which parallel
// tests must not see.
func TestInsertCarriesTraceContext(t *testing.T) {
	uninstall := tracing.Install(sdktrace.NewTracerProvider())
	t.Cleanup(uninstall)
	b := setup(t)
	ctx, span := otel.Tracer("test").Start(context.Background(), "state change")
	defer span.End()

	msg := testMsg(0)
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return Insert(ctx, tx, owner, msg)
	}))
	require.Empty(t, msg.Header.Get("traceparent"), "the caller's message is not modified")

	r := b.relay(t, nil)
	_, err := r.Flush(ctx)
	require.NoError(t, err)
	msgs := b.streamMsgs(t)
	require.Len(t, msgs, 1)
	want := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"
	require.Equal(t, want, msgs[0].Header.Get("traceparent"))
	require.Equal(t, []string{"a", "b"}, msgs[0].Header.Values("X-Multi"))
}
