package natstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// SetMaxBytes sets stream's max_bytes, e.g. to a few KiB (below what
// streams.Options allows) so that a test fills it, and returns the
// stream's configuration as updated.
func SetMaxBytes(t testing.TB, ctx context.Context, js jetstream.JetStream, stream string, maxBytes int64) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("natstest: stream %s: %v", stream, err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxBytes = maxBytes
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("natstest: set max_bytes of %s: %v", stream, err)
	}
	return cfg
}
