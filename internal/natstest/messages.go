package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Messages reads, in stream order, every message of stream matching
// filter that is stored when it is called. It fails the test when a
// fetch comes back empty before all of them are read, rather than return
// fewer: a test counting messages must not count short.
func Messages(t testing.TB, ctx context.Context, js jetstream.JetStream, stream, filter string) []jetstream.Msg {
	t.Helper()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatalf("natstest: read %s: %v", stream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatalf("natstest: read %s: %v", stream, err)
	}
	pending := int(info.NumPending)
	var out []jetstream.Msg
	for len(out) < pending {
		batch, err := cons.Fetch(pending-len(out), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatalf("natstest: fetch from %s: %v", stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("natstest: fetch from %s: %v", stream, err)
		}
		if n == 0 {
			t.Fatalf("natstest: fetch from %s returned nothing, %d of %d read", stream, len(out), pending)
		}
	}
	return out
}
