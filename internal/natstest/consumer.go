package natstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Settled reports whether a consumer has nothing left to deliver and
// nothing awaiting an ack: what a test polls for before it checks what
// the consumer's handler did, or that a refused message was terminated
// rather than left for redelivery. It fails the test when the consumer
// cannot be read.
func Settled(t testing.TB, ctx context.Context, js jetstream.JetStream, stream, consumer string) bool {
	t.Helper()
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		t.Fatalf("natstest: consumer %s of %s: %v", consumer, stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("natstest: consumer %s of %s: %v", consumer, stream, err)
	}
	return info.NumAckPending == 0 && info.NumPending == 0
}
