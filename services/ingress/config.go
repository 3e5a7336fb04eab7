package ingress

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/failpoint"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/errclass"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytes      = 1 << 20
	DefaultMaxBatchBodyBytes = 8 << 20
	DefaultMaxBatchEvents    = 500
	DefaultPublishTimeout    = 10 * time.Second
	DefaultSourceCacheTTL    = time.Second
	DefaultAckWait           = 30 * time.Second
	DefaultConcurrency       = 8
	DefaultRelayInterval     = time.Second
	DefaultReconcileInterval = 30 * time.Second
	DefaultReconcileAfter    = 3 * time.Minute
	DefaultWindowRetention   = time.Hour
	DefaultInboxRetention    = 7 * 24 * time.Hour
	DefaultMaxSourceLabels   = 1000
)

// Names of the durable consumers and of the outbox owner.
const (
	ConsumerGate       = "ingress-gate"
	ConsumerRetry      = "ingress-retry"
	ConsumerRetryState = "ingress-retry-state"
	OutboxOwner        = "ingress"
	// PublisherSource is the CloudEvents source of lifecycle events ingress
	// publishes.
	PublisherSource = "retryd/ingress"
)

// Failpoints name the places where Config.Failpoint is consulted.
const (
	// FailpointGateCommitted: the gate committed the event (and its outbox
	// messages) and has neither woken the relay nor acked INGEST.
	FailpointGateCommitted = "gate.committed"
	// FailpointRetryCommitted: the same after a due event was decided.
	FailpointRetryCommitted = "retry.committed"
	// FailpointReleaseCommitted: the releaser committed a batch of a
	// release line (events admitted, outbox written), before the relay is
	// woken.
	FailpointReleaseCommitted = "release.committed"
)

// Config configures a Service. Zero durations and sizes take the defaults.
type Config struct {
	Pool *pgxpool.Pool
	// JS is used to publish (intake, relay) and to consume. The streams
	// must exist (streams.Ensure).
	JS         jetstream.JetStream
	Logger     zerolog.Logger
	Registerer prometheus.Registerer
	// Health, when set, is marked ready by Start and not ready by Stop.
	Health *serve.Health
	// Streams, when set, lets the reconciler recreate a deleted stream
	// (streams.CreateMissing with these options) before recreating the consumers
	// on it. Nil leaves streams to the operator.
	Streams *streams.Options

	// MaxBodyBytes caps the body of POST /v1/events (413 above it).
	MaxBodyBytes int64
	// MaxBatchBodyBytes caps the body of POST /v1/events:batch.
	MaxBatchBodyBytes int64
	// MaxBatchEvents is the most events one batch may hold.
	MaxBatchEvents int
	// PublishTimeout bounds the wait for JetStream's PubAck on intake.
	PublishTimeout time.Duration
	// IntakeRate is how many intake requests (POST /v1/events or
	// /v1/events:batch, each one request) a second one caller (a token's
	// name) may send; above it intake answers 429 with Retry-After. Zero
	// is no limit. It guards the intake path itself; the sources' rate
	// limits (the gate) decide when events are admitted.
	IntakeRate float64
	// IntakeBurst is how many requests a caller may send at once above
	// IntakeRate. Default: IntakeRate rounded up, at least 1.
	IntakeBurst int
	// MaxIntakeCallers bounds the callers whose rate is tracked
	// (DefaultMaxIntakeCallers); the least recently seen is forgotten.
	MaxIntakeCallers int
	// SourceCacheTTL is how long intake trusts its copy of a source's
	// allowed types; the gate always checks the database.
	SourceCacheTTL time.Duration

	// AckWait is the consumers' ack wait: a message not acked by then (an
	// instance died) is delivered again.
	AckWait time.Duration
	// Concurrency is how many sources the gate decides at once (the events
	// of one source are decided in arrival order, one batch in one
	// transaction), and how many dues the retry consumer processes at once,
	// per instance.
	Concurrency int
	// PausedClass is the error class of source_paused deferrals:
	// errclass.Temporary (default) or errclass.RateLimit. Throttled
	// deferrals are always rate_limit.
	PausedClass errclass.Class

	// RelayInterval is how often the outbox relay polls; commits also wake
	// it at once.
	RelayInterval time.Duration
	// ReconcileInterval is how often deferrals the scheduler has not
	// confirmed are looked for (and old rate windows and inbox rows pruned).
	ReconcileInterval time.Duration
	// ReconcileAfter is how long a deferral may stay unconfirmed before its
	// failed event is published again. Keep it above the RETRIES duplicate
	// window (2m): JetStream drops a republish inside it.
	ReconcileAfter time.Duration
	// WindowRetention keeps ended rate windows this long.
	WindowRetention time.Duration
	// InboxRetention prunes inbox rows older than this; negative disables
	// pruning (another service does it).
	InboxRetention time.Duration
	// MaxSourceLabels bounds the number of distinct source label values on
	// metrics; further sources are counted as "_other".
	MaxSourceLabels int

	// Failpoint is for tests: when set it is called at the Failpoint*
	// places, and a non-nil error stops the handler there as if the process
	// died (no relay wake-up, no ack).
	Failpoint failpoint.Func
	// Now is the clock for intake times; nil is time.Now.
	Now func() time.Time
}

func (c *Config) validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("Config.Pool is required"))
	}
	if c.JS == nil {
		errs = append(errs, errors.New("Config.JS is required"))
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	setDefault(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.MaxBatchBodyBytes, DefaultMaxBatchBodyBytes)
	setDefault(&c.MaxBatchEvents, DefaultMaxBatchEvents)
	setDefault(&c.PublishTimeout, DefaultPublishTimeout)
	setDefault(&c.SourceCacheTTL, DefaultSourceCacheTTL)
	setDefault(&c.AckWait, DefaultAckWait)
	setDefault(&c.Concurrency, DefaultConcurrency)
	setDefault(&c.RelayInterval, DefaultRelayInterval)
	setDefault(&c.ReconcileInterval, DefaultReconcileInterval)
	setDefault(&c.ReconcileAfter, DefaultReconcileAfter)
	setDefault(&c.WindowRetention, DefaultWindowRetention)
	setDefault(&c.InboxRetention, DefaultInboxRetention)
	setDefault(&c.MaxSourceLabels, DefaultMaxSourceLabels)
	setDefault(&c.MaxIntakeCallers, DefaultMaxIntakeCallers)
	if c.IntakeRate > 0 && c.IntakeBurst == 0 {
		c.IntakeBurst = max(1, int(math.Ceil(c.IntakeRate)))
	}
	if c.PausedClass == "" {
		c.PausedClass = errclass.Temporary
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.MaxBodyBytes > 0, "Config.MaxBodyBytes must be positive, got %d", c.MaxBodyBytes)
	check(c.MaxBatchBodyBytes > 0, "Config.MaxBatchBodyBytes must be positive, got %d", c.MaxBatchBodyBytes)
	check(c.MaxBatchEvents > 0 && c.MaxBatchEvents <= 10_000, "Config.MaxBatchEvents must be between 1 and 10000, got %d", c.MaxBatchEvents)
	check(c.PublishTimeout > 0, "Config.PublishTimeout must be positive, got %s", c.PublishTimeout)
	check(c.SourceCacheTTL > 0, "Config.SourceCacheTTL must be positive, got %s", c.SourceCacheTTL)
	check(c.AckWait >= 100*time.Millisecond, "Config.AckWait must be at least 100ms, got %s", c.AckWait)
	check(c.Concurrency > 0 && c.Concurrency <= 256, "Config.Concurrency must be between 1 and 256, got %d", c.Concurrency)
	check(c.PausedClass == errclass.Temporary || c.PausedClass == errclass.RateLimit,
		"Config.PausedClass must be %q or %q, got %q", errclass.Temporary, errclass.RateLimit, c.PausedClass)
	check(c.RelayInterval > 0, "Config.RelayInterval must be positive, got %s", c.RelayInterval)
	check(c.ReconcileInterval > 0, "Config.ReconcileInterval must be positive, got %s", c.ReconcileInterval)
	check(c.ReconcileAfter > 0, "Config.ReconcileAfter must be positive, got %s", c.ReconcileAfter)
	check(c.WindowRetention > 0, "Config.WindowRetention must be positive, got %s", c.WindowRetention)
	check(c.IntakeRate >= 0 && !math.IsInf(c.IntakeRate, 0) && !math.IsNaN(c.IntakeRate), "Config.IntakeRate must be a non-negative number, got %v", c.IntakeRate)
	check(c.IntakeBurst >= 0, "Config.IntakeBurst must not be negative, got %d", c.IntakeBurst)
	check(c.MaxIntakeCallers > 0, "Config.MaxIntakeCallers must be positive, got %d", c.MaxIntakeCallers)
	check(c.MaxSourceLabels > 0, "Config.MaxSourceLabels must be positive, got %d", c.MaxSourceLabels)
	if c.Streams != nil {
		if err := c.Streams.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("Config.Streams: %w", err))
		}
	}
	return errors.Join(errs...)
}

func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}
