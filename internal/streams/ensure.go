package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Ensure creates the six streams, or updates them to the configuration of
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

// CreateMissing creates the streams that do not exist, with the
// configuration of opts, and leaves the existing ones as they are. It is
// what the services run (at start, and when a stream was deleted): their
// NATS users may create a stream but not change one, so a leaked service
// credential cannot shrink a stream's limits and drop its messages.
// Changing streams is the admin's `retryd streams ensure` (Ensure).
//
// It returns, per existing stream whose configuration differs from this
// version's in a field retryd relies on, a line naming the stream and the
// fields, for the caller to log: run `retryd streams ensure` to apply them.
func CreateMissing(ctx context.Context, js jetstream.JetStream, opts Options) ([]string, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("create streams: %w", err)
	}
	var drift []string
	for _, cfg := range Configs(opts) {
		s, err := js.Stream(ctx, cfg.Name)
		switch {
		case err == nil:
			if fields := differs(cfg, s.CachedInfo().Config); len(fields) > 0 {
				drift = append(drift, cfg.Name+": "+strings.Join(fields, ", "))
			}
			continue
		case !errors.Is(err, jetstream.ErrStreamNotFound):
			return drift, fmt.Errorf("look up stream %s: %w", cfg.Name, err)
		}
		if _, err := js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return drift, fmt.Errorf("create stream %s: %w", cfg.Name, err)
		}
	}
	return drift, nil
}

// differs names the fields retryd relies on where existing is not want.
// Limits an operator may tune (max_bytes, replicas) are not compared.
func differs(want, existing jetstream.StreamConfig) []string {
	var fields []string
	check := func(name string, same bool) {
		if !same {
			fields = append(fields, name)
		}
	}
	check("subjects", slices.Equal(slices.Sorted(slices.Values(want.Subjects)), slices.Sorted(slices.Values(existing.Subjects))))
	check("retention", want.Retention == existing.Retention)
	check("storage", want.Storage == existing.Storage)
	check("discard", want.Discard == existing.Discard)
	check("duplicate_window", want.Duplicates == existing.Duplicates)
	check("max_msg_size", want.MaxMsgSize == existing.MaxMsgSize)
	check("allow_direct", want.AllowDirect == existing.AllowDirect)
	check("deny_delete", want.DenyDelete == existing.DenyDelete)
	check("deny_purge", want.DenyPurge == existing.DenyPurge)
	return fields
}
