package tracing

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// ConsumeHandler wraps the message handler of a durable consumer: each
// message is handled under a consumer span continuing the trace in its
// headers, and a returned error marks the span failed. The handler's ctx
// carries the span, so the outbox rows it writes continue the trace.
func ConsumeHandler(consumer string, h func(context.Context, jetstream.Msg) error) func(context.Context, jetstream.Msg) error {
	return func(ctx context.Context, msg jetstream.Msg) error {
		ctx, span := StartConsume(ctx, msg.Subject(), consumer, msg.Headers())
		defer span.End()
		err := h(ctx, msg)
		Fail(span, err)
		return err
	}
}
