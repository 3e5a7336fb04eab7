package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// Defaults of the pending set.
const (
	// DefaultPendingLimit is how many failed and held facts an owner keeps
	// until their decision: a few hundred bytes to 1 MiB each.
	DefaultPendingLimit = 100_000
	// DefaultRepublishAfter outlasts RETRIES' 2-minute duplicate window.
	DefaultRepublishAfter = 3 * time.Minute
)

// Publish retries: a failed publish is tried publishAttempts times with
// doubling pauses before the caller hands its message back to the broker.
const (
	publishAttempts = 5
	publishTimeout  = 5 * time.Second
	publishPause    = 100 * time.Millisecond
)

// ReporterConfig configures a Reporter.
type ReporterConfig struct {
	// JS publishes the facts and reads RETRIES; its connection carries the
	// subscriptions that follow the decisions.
	JS jetstream.JetStream
	// Kind is the items' kind: the <kind> token of their subjects.
	Kind string
	// PendingLimit caps the facts kept until their decision; -1 keeps
	// none. 0 is DefaultPendingLimit.
	PendingLimit int
	// RepublishAfter is how long a kept fact waits for its decision
	// before it is looked for on RETRIES (0: DefaultRepublishAfter, or the
	// stream's duplicate window plus a minute if that is longer).
	RepublishAfter time.Duration
	// Metrics are counted into; NewReporterMetrics builds them.
	Metrics *ReporterMetrics
	Logger  *slog.Logger
	Now     func() time.Time
}

// Reporter publishes an owner's facts on RETRIES: succeeded, failed and
// held, each with its deterministic Nats-Msg-Id, tried again on errors.
// It keeps every failed and held fact until it sees the scheduler's
// decision for that attempt, and publishes it again, with the same id,
// if a purge removed it from the stream before the scheduler read it
// (docs/contract.md, "What a purge of RETRIES loses"). Every owner, the
// worker SDK included, reports through one.
type Reporter struct {
	cfg      ReporterConfig
	log      *slog.Logger
	retries  jetstream.Stream
	wait     time.Duration
	pending  *pendingSet
	cancel   context.CancelFunc
	loopDone chan struct{}
}

// NewReporter checks cfg against the RETRIES stream (RepublishAfter must
// outlast its duplicate window) and, unless PendingLimit is -1, starts
// following decisions and checking kept facts until Close.
func NewReporter(ctx context.Context, cfg ReporterConfig) (*Reporter, error) {
	switch {
	case cfg.JS == nil:
		return nil, errors.New("new reporter: ReporterConfig.JS is required")
	case cfg.Metrics == nil:
		return nil, errors.New("new reporter: ReporterConfig.Metrics is required")
	case cfg.PendingLimit < -1:
		return nil, fmt.Errorf("new reporter: Config.PendingLimit must be -1 (keep none) or more than 0, got %d", cfg.PendingLimit)
	case cfg.RepublishAfter < 0:
		return nil, fmt.Errorf("new reporter: Config.RepublishAfter must not be negative, got %s", cfg.RepublishAfter)
	}
	if err := contract.ValidateToken("kind", cfg.Kind); err != nil {
		return nil, fmt.Errorf("new reporter: %w", err)
	}
	if cfg.PendingLimit == 0 {
		cfg.PendingLimit = DefaultPendingLimit
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Reporter{cfg: cfg, log: cfg.Logger, loopDone: make(chan struct{})}
	if cfg.PendingLimit < 0 {
		close(r.loopDone)
		return r, nil
	}
	// The duplicate window RETRIES has, not the one it should have.
	retries, err := cfg.JS.Stream(ctx, contract.StreamRetries)
	if err != nil {
		return nil, fmt.Errorf("new reporter: read stream %s: %w", contract.StreamRetries, err)
	}
	if r.wait, err = republishWindow(cfg.RepublishAfter, retries.CachedInfo().Config.Duplicates); err != nil {
		return nil, fmt.Errorf("new reporter: %w", err)
	}
	r.retries = retries
	r.pending = newPendingSet(cfg.JS.Conn(), cfg.Kind, cfg.PendingLimit, r.wait, cfg.Now, r.log, cfg.Metrics)
	loopCtx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.republishLoop(loopCtx)
	return r, nil
}

// RepublishAfter is the wait in force: how long a kept fact waits for its
// decision before it is looked for (0 when none are kept).
func (r *Reporter) RepublishAfter() time.Duration { return r.wait }

// Report publishes the fact msg of attempt of item id, ev being its
// event, and waits for the stream's ack, trying again on errors with
// doubling pauses until ctx ends. A failed or held fact is kept until
// its decision is seen, with its subscription in place before the
// publish, so that a fast decision cannot pass unseen.
func (r *Reporter) Report(ctx context.Context, id string, attempt int, ev contract.Lifecycle, msg *nats.Msg) (*jetstream.PubAck, error) {
	var kept *pendingFact
	if r.pending != nil && (ev == contract.Failed || ev == contract.Held) {
		kept = r.pending.track(id, attempt, ev)
	}
	ack, err := r.Publish(ctx, msg, string(ev))
	if kept != nil {
		if err != nil {
			r.pending.abandon(kept)
		} else {
			r.pending.published(kept, msg, ack.Sequence)
		}
	}
	return ack, err
}

// Publish sends msg and waits for the stream's ack, trying again on
// errors with doubling pauses; label names msg in the publish-retry
// metric. It gives up after a few tries or when ctx ends.
func (r *Reporter) Publish(ctx context.Context, msg *nats.Msg, label string) (*jetstream.PubAck, error) {
	pause := publishPause
	var err error
	for i := range publishAttempts {
		if i > 0 {
			r.cfg.Metrics.PublishRetries.WithLabelValues(label).Inc()
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return nil, fmt.Errorf("publish %s: %w (last error: %w)", label, ctx.Err(), err)
			}
			pause *= 2
		}
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		ack, pubErr := r.cfg.JS.PublishMsg(pctx, msg)
		cancel()
		if pubErr == nil {
			return ack, nil
		}
		err = pubErr
	}
	return nil, fmt.Errorf("publish %s: %w", label, err)
}

// Close stops following decisions and returns how many facts were still
// undecided: they are on RETRIES for the scheduler to read, and only a
// purge before it does loses them. Later facts are published without a
// copy kept.
func (r *Reporter) Close() int {
	if r.pending == nil {
		return 0
	}
	r.cancel()
	<-r.loopDone
	return r.pending.close()
}
