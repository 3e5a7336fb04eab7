package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// Ensure creates the six streams, or updates them to the configuration of
// opts when they exist. It is idempotent and safe to call from several
// processes at once (every service calls it at start) and after a stream
// was deleted, which it recreates empty.
//
// An existing stream keeps what an operator set that opts does not name:
// its replicas when opts.Replicas is 0, and a positive max_bytes (`nats
// stream edit`) when opts.MaxBytes does not name it. One whose max_bytes
// was -1, as every stream's was before retryd set limits, gets the
// default, and discard new, in place: nothing is deleted (with discard
// new the server never removes messages to meet a limit). SCHEDULES keeps
// discard old and gets its default max_bytes only if it stores less.
//
// Changes a server cannot apply in place (storage type, for instance) are
// returned as errors naming the stream, and so is a max_bytes below what
// an existing stream already stores, which would make it refuse every new
// message (SCHEDULES: delete its oldest): then no stream is changed.
func Ensure(ctx context.Context, js jetstream.JetStream, opts Options) error {
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("ensure streams: %w", err)
	}
	cfgs := Configs(opts)
	var errs []error
	for i, cfg := range cfgs {
		existing, err := js.Stream(ctx, cfg.Name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			continue
		case err != nil:
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
		info := existing.CachedInfo()
		cfgs[i] = keepOperatorLimits(cfg, info.Config, opts)
		if err := fits(cfgs[i], info.State); err != nil {
			errs = append(errs, err)
		}
		if cfgs[i], err = keepShards(cfgs[i], info.Config, opts); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, cfg := range cfgs {
		if err := ensure(ctx, js, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// keepOperatorLimits returns cfg with the limits of the stream as it
// exists that opts leaves to the operator.
func keepOperatorLimits(cfg, existing jetstream.StreamConfig, opts Options) jetstream.StreamConfig {
	if opts.Replicas == 0 && existing.Replicas > 0 {
		cfg.Replicas = existing.Replicas
	}
	if _, named := opts.MaxBytes[cfg.Name]; !named && existing.MaxBytes > 0 {
		cfg.MaxBytes = existing.MaxBytes
	}
	return cfg
}

// StreamShards is the number of shards a RETRIES configuration splits
// the stream into: 1 without a subject transform, 0 (and false) for a
// transform that is not retryd's.
func StreamShards(cfg jetstream.StreamConfig) (int, bool) {
	if cfg.SubjectTransform == nil || cfg.SubjectTransform.Destination == "" {
		return 1, true
	}
	return contract.ParseRetryShardTransform(cfg.SubjectTransform.Destination)
}

// keepShards returns cfg with the RETRIES split that the stream as it
// exists must keep. Items are placed by their hash modulo the count, so
// only a multiple of the count keeps each item's old shard among its
// possible new ones (s goes to s, s+N, s+2N...; see docs/shards.md): a
// lower count or one that is not a multiple would strand facts stored
// on the old layout. A count below the existing one that divides it is
// an older service's view during resharding: the stream keeps its count.
func keepShards(cfg, existing jetstream.StreamConfig, opts Options) (jetstream.StreamConfig, error) {
	if cfg.Name != contract.StreamRetries {
		return cfg, nil
	}
	have, ok := StreamShards(existing)
	if !ok {
		if opts.Shards == 0 {
			return cfg, nil
		}
		return cfg, fmt.Errorf("stream %s has a subject transform retryd did not write (%s): remove it before setting %s",
			cfg.Name, existing.SubjectTransform.Destination, EnvShards)
	}
	want := opts.Shards
	switch {
	case want == 0 || want == have || (want < have && have%want == 0):
		cfg.SubjectTransform = existing.SubjectTransform
	case want < have || want%have != 0:
		return cfg, fmt.Errorf("stream %s is split into %d shards: %s=%d would strand items stored on the old layout; only a multiple of %d is allowed (docs/shards.md)",
			cfg.Name, have, EnvShards, want, have)
	}
	return cfg, nil
}

// fits refuses a max_bytes below what the stream stores: with discard new
// the stream would refuse every message until max_age freed enough; with
// discard old (SCHEDULES) the server would delete the oldest at once.
func fits(cfg jetstream.StreamConfig, state jetstream.StreamState) error {
	if cfg.MaxBytes <= 0 || state.Bytes <= uint64(cfg.MaxBytes) {
		return nil
	}
	effect := "refuse every new message"
	if cfg.Discard == jetstream.DiscardOld {
		effect = "delete its oldest messages to fit"
	}
	return fmt.Errorf("ensure stream %s: it stores %d bytes, more than the max_bytes %d it would get, so it would %s: set %s above %d (or -1, no limit) and run again; nothing was changed",
		cfg.Name, state.Bytes, cfg.MaxBytes, effect, EnvMaxBytes(cfg.Name), state.Bytes)
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
// Limits an operator may tune (max_bytes, replicas) are not compared;
// the discard policy is: a stream that discards old may delete facts.
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
