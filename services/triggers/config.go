package triggers

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/failpoint"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/internal/streams"
)

// Durable consumer names (docs/design.md).
const (
	ConsumerEvents     = "triggers-events"
	ConsumerRetry      = "triggers-retry"
	ConsumerRetryState = "triggers-retry-state"
	ConsumerRuns       = "triggers-runs"
)

// OutboxOwner is the owner of the service's outbox rows.
const OutboxOwner = "triggers"

// EventSource is the CloudEvents source of what the service publishes.
const EventSource = "retryd/triggers"

// Config configures the triggers service. New fills zero fields with the
// defaults documented on each field.
type Config struct {
	// Pool is the Postgres pool (required).
	Pool *pgxpool.Pool
	// JS is the JetStream context (required). The EVENTS, RETRIES and RUNS
	// streams must exist (streams.Ensure).
	JS jetstream.JetStream
	// Logger receives the service's logs.
	Logger zerolog.Logger
	// Registerer receives the metrics (default: a private registry, i.e.
	// metrics are not exported).
	Registerer prometheus.Registerer
	// Health, when set, is marked ready once the consumers run and not
	// ready when the service stops.
	Health *serve.Health
	// Streams, when set, lets the service recreate a deleted stream
	// (streams.CreateMissing with these options) before recreating the consumers
	// on it. Nil leaves streams to the operator.
	Streams *streams.Options

	// Concurrency is how many messages each consumer handles at once
	// (default 4).
	Concurrency int
	// AckWait is how long JetStream waits for an ack before redelivering
	// (default 30s).
	AckWait time.Duration
	// NakDelay is how long a message waits before redelivery after a
	// transient error, e.g. Postgres unreachable (default 1s).
	NakDelay time.Duration
	// CostLimit bounds the CEL cost of one predicate or key evaluation
	// (default DefaultCostLimit).
	CostLimit uint64
	// ProgramCacheSize is how many compiled trigger versions are kept
	// (default 1024).
	ProgramCacheSize int
	// MaxBodyBytes caps HTTP request bodies (default 64 KiB).
	MaxBodyBytes int64
	// RelayInterval is how often the outbox relay polls when not kicked
	// (default 500ms).
	RelayInterval time.Duration
	// ReconcileInterval is how often held deliveries whose failed event the
	// scheduler never confirmed are published again (default 1m; negative
	// disables).
	ReconcileInterval time.Duration
	// ReconcileAfter is how long a held delivery waits for the scheduler's
	// confirmation before it is reconciled (default 2m).
	ReconcileAfter time.Duration
	// CheckInterval is how often the durable consumers are looked for and
	// recreated when they were deleted (default 30s).
	CheckInterval time.Duration
	// RunTimeout is how long a launched run may hold its concurrency slot
	// without a heartbeat or its completed or failed message arriving
	// (default 1h), for triggers that set no run_timeout of their own:
	// then it is failed as run_timeout within LeaseInterval, and the slot
	// goes to the delivery that waited longest.
	RunTimeout time.Duration
	// LeaseInterval is how often runs whose lease ended are looked for
	// (default 1s, negative disables): a slot frees within about this long
	// of its lease ending. The query reads only the runs in flight.
	LeaseInterval time.Duration
	// InboxRetention is how long inbox rows (applied message ids) are kept
	// before they are pruned (default 168h; negative disables pruning).
	// State guards on attempts and statuses catch replays older than it.
	InboxRetention time.Duration

	// failpoint, when set (tests only), is called at named points of the
	// delivery paths; an error there acts as a crash at that point.
	failpoint failpoint.Func
	// noRelay (tests only) leaves outbox rows unpublished, as a process
	// killed right after its commit would.
	noRelay bool
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
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Concurrency < 1 || c.Concurrency > 256 {
		errs = append(errs, fmt.Errorf("Config.Concurrency must be between 1 and 256, got %d", c.Concurrency))
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("Config.AckWait must be at least 1s, got %s", c.AckWait))
	}
	if c.NakDelay == 0 {
		c.NakDelay = time.Second
	}
	if c.NakDelay < 0 {
		errs = append(errs, fmt.Errorf("Config.NakDelay must not be negative, got %s", c.NakDelay))
	}
	if c.CostLimit == 0 {
		c.CostLimit = DefaultCostLimit
	}
	if c.ProgramCacheSize == 0 {
		c.ProgramCacheSize = 1024
	}
	if c.ProgramCacheSize < 1 {
		errs = append(errs, fmt.Errorf("Config.ProgramCacheSize must be at least 1, got %d", c.ProgramCacheSize))
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 64 << 10
	}
	if c.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("Config.MaxBodyBytes must be at least 1024, got %d", c.MaxBodyBytes))
	}
	if c.RelayInterval == 0 {
		c.RelayInterval = 500 * time.Millisecond
	}
	if c.RelayInterval < 0 {
		errs = append(errs, fmt.Errorf("Config.RelayInterval must not be negative, got %s", c.RelayInterval))
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = time.Minute
	}
	if c.ReconcileAfter == 0 {
		c.ReconcileAfter = 2 * time.Minute
	}
	if c.InboxRetention == 0 {
		c.InboxRetention = 168 * time.Hour
	}
	if c.RunTimeout == 0 {
		c.RunTimeout = time.Hour
	}
	if c.LeaseInterval == 0 {
		c.LeaseInterval = time.Second
	}
	if c.RunTimeout < 0 {
		errs = append(errs, fmt.Errorf("Config.RunTimeout must be positive, got %s", c.RunTimeout))
	}
	if c.CheckInterval < 0 {
		errs = append(errs, fmt.Errorf("Config.CheckInterval must not be negative, got %s", c.CheckInterval))
	}
	if c.Streams != nil {
		if err := c.Streams.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("Config.Streams: %w", err))
		}
	}
	if c.ReconcileAfter < 0 {
		errs = append(errs, fmt.Errorf("Config.ReconcileAfter must not be negative, got %s", c.ReconcileAfter))
	}
	return errors.Join(errs...)
}
