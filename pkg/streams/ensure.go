package streams

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Ensure creates the five streams, or updates them to the configuration of
// opts when they exist. It is idempotent and safe to call from several
// processes at once (every service calls it at start) and after a stream
// was deleted, which it recreates empty.
//
// Changes a server cannot apply in place (storage type, for instance) are
// returned as errors naming the stream; nothing is deleted.
func Ensure(ctx context.Context, js jetstream.JetStream, opts Options) error {
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("ensure streams: %w", err)
	}
	for _, cfg := range Configs(opts) {
		if opts.Replicas == 0 {
			existing, err := js.Stream(ctx, cfg.Name)
			switch {
			case err == nil:
				cfg = keepReplicas(cfg, existing.CachedInfo().Config)
			case !errors.Is(err, jetstream.ErrStreamNotFound):
				return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
			}
		}
		if err := ensure(ctx, js, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// keepReplicas returns cfg with the replicas of the stream as it exists.
func keepReplicas(cfg, existing jetstream.StreamConfig) jetstream.StreamConfig {
	if existing.Replicas > 0 {
		cfg.Replicas = existing.Replicas
	}
	return cfg
}

// ensure is CreateOrUpdateStream made safe against a concurrent creator:
// two callers that both miss the stream both create it, and the second one
// gets "name already in use" when the first one's stream differs in a
// detail the server filled in; updating then converges.
func ensure(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	var err error
	for range 3 {
		_, err = js.CreateOrUpdateStream(ctx, cfg)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return err
		}
	}
	return err
}
