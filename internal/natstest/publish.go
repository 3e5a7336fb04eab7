package natstest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishWindow is how many async publishes PublishAll has outstanding at
// most: well under the client's cap (jetstream.WithPublishAsyncMaxPending,
// 4000 by default), which it shares with the services a test runs on the
// same JetStream context.
const publishWindow = 500

// stallWait is how long one PublishMsgAsync may wait for room under the
// cap before PublishAll tries it again; it retries until ctx ends.
const stallWait = time.Second

// PublishAll publishes msgs in order without waiting for each PubAck, a
// window at a time, and fails the test unless every one is stored. It
// returns the PubAcks in the order of msgs.
//
// A publish that finds the connection's cap full waits for PubAcks until
// ctx ends: the client's own wait (200 ms) is shorter than a loaded
// machine takes to acknowledge thousands of messages (issue 39: "nats:
// stalled with too many outstanding async published messages").
func PublishAll(t testing.TB, ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) []*jetstream.PubAck {
	t.Helper()
	acks := make([]*jetstream.PubAck, 0, len(msgs))
	for len(msgs) > 0 {
		n := min(publishWindow, len(msgs))
		futures := make([]jetstream.PubAckFuture, n)
		for i, m := range msgs[:n] {
			f, err := publishAsync(ctx, js, m)
			if err != nil {
				t.Fatalf("natstest: publish %s: %v", m.Subject, err)
			}
			futures[i] = f
		}
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				acks = append(acks, ack)
			case err := <-f.Err():
				t.Fatalf("natstest: publish %s: %v", f.Msg().Subject, err)
			case <-ctx.Done():
				t.Fatalf("natstest: publish %s: no PubAck: %v", f.Msg().Subject, ctx.Err())
			}
		}
		msgs = msgs[n:]
	}
	return acks
}

// publishAsync is PublishMsgAsync that waits for room under the cap on
// outstanding publishes until ctx ends.
func publishAsync(ctx context.Context, js jetstream.JetStream, m *nats.Msg) (jetstream.PubAckFuture, error) {
	for {
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait))
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for room to publish: %w (gave up: %w)", err, ctx.Err())
		}
	}
}
