package scheduler

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/failpoint"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/backoff"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// Defaults of Config.
const (
	DefaultBatchSize         = 1000
	DefaultEmitters          = 4
	DefaultConsumeBatch      = 500
	DefaultMaxAckPending     = 5000
	DefaultReleasePart       = 1000
	DefaultAckWait           = 2 * time.Second
	DefaultMaxIdle           = time.Second
	DefaultRedueAfter        = 5 * time.Minute
	DefaultReconcileInterval = 30 * time.Second
	DefaultMetricsInterval   = 15 * time.Second
	DefaultRelayInterval     = time.Second
	DefaultInboxRetention    = 7 * 24 * time.Hour
	DefaultLockTimeout       = 5 * time.Second
)

// Config configures a Scheduler. Pool and JS are required; every other
// field has a default.
type Config struct {
	// Pool is the Postgres pool holding the retries projection, the
	// policies, the inbox and the outbox.
	Pool *pgxpool.Pool
	// JS publishes to and consumes from the RETRIES stream.
	JS jetstream.JetStream
	// Logger receives structured logs (ids, kinds, attempts, classes; never
	// payloads or error messages). The zero value discards them.
	Logger zerolog.Logger
	// Registerer receives the retryd_scheduler_* metrics and the outbox
	// relay's; nil means a private registry (metrics are not exported).
	Registerer prometheus.Registerer
	// Instance names this process in logs; default host name and pid.
	Instance string

	// BatchSize bounds the rows one due emission transaction publishes.
	BatchSize int
	// Emitters is how many due emission transactions run at once while a
	// backlog of due rows lasts (a burst); when fewer than a batch are due,
	// one loop emits them.
	Emitters int
	// ConsumeBatch bounds the lifecycle messages applied in one policy
	// stage transaction.
	ConsumeBatch int
	// ReleasePart bounds the held rows one part of a release ranks: a
	// release of every hold of a key is applied a part at a time, each in
	// its own transaction and each a little before its rows' slots, so a
	// release of 100,000 holds does not take a Postgres backend for
	// seconds (docs/ingress.md, Releases).
	ReleasePart int
	// MaxAckPending bounds the messages the durable consumer hands out
	// without an ack (across all instances). One instance holds at most
	// three ConsumeBatch (the client's pull buffer, the stage's queue and
	// the batch being applied), so the default leaves room for a restarted
	// or surviving instance to take new facts while a killed instance's
	// share waits out AckWait.
	MaxAckPending int
	// AckWait is how long JetStream waits for an ack before redelivering:
	// a killed instance's facts are decided by another one after it.
	// Facts an instance was handed are kept by in-progress acks every
	// AckWait/4, so a slow batch is not redelivered; facts still in the
	// client's pull buffer during a stall longer than AckWait can be (the
	// inbox makes each copy a duplicate).
	AckWait time.Duration
	// MaxIdle caps the due loop's sleep, which otherwise lasts until the
	// earliest next_attempt_at. It bounds how late a retry scheduled by
	// another instance can be noticed.
	MaxIdle time.Duration
	// LockTimeout bounds how long the policy stage and operator actions
	// wait for a row lock. An instance that hangs inside a transaction
	// (frozen, partitioned) holds its locks; without a bound every other
	// instance would stall behind it. A message that times out is handed
	// back and applied later.
	LockTimeout time.Duration
	// RedueAfter is how long a due retry may go without an outcome from its
	// owner before its due event is published again, with the same
	// Nats-Msg-Id. It must exceed the RETRIES duplicate window, or
	// JetStream would drop the re-emission as a duplicate.
	RedueAfter time.Duration
	// ReconcileInterval is how often streams and the consumer are
	// re-created if deleted and the outbox flushed.
	ReconcileInterval time.Duration
	// MetricsInterval is how often the pending and outbox gauges are
	// refreshed from the database.
	MetricsInterval time.Duration
	// RelayInterval is how often the outbox relay polls for rows nobody
	// kicked it for (another instance's, or left by a crash).
	RelayInterval time.Duration
	// InboxRetention is how long applied message ids are kept in the inbox
	// (of every consumer: pruning is shared); older duplicates are caught
	// by the state guards. Negative disables pruning here (another service
	// prunes).
	InboxRetention time.Duration
	// Streams are the options streams.CreateMissing recreates a deleted
	// stream with.
	Streams streams.Options
	// Shards is how many scheduler shards RETRIES is split into, each
	// with its own database (docs/shards.md); 0 or 1 is one, unsplit. It
	// defaults to Streams.Shards.
	Shards int
	// Shard is the shard this scheduler owns, 0 to Shards-1: it consumes
	// the facts the stream stored with that shard token (shard 0 also
	// those stored before the split) and emits the dues of its database.
	Shard int
	// Classifier classifies failures that carry no error class by their
	// message; default errclass.DefaultClassifier().
	Classifier *errclass.Classifier
	// Rand draws backoff jitter; nil means a goroutine-safe default source.
	Rand backoff.Rand

	// Failpoint is for tests: when set it is called at the Failpoint*
	// places, and an error there makes the scheduler behave as if the
	// process died right there.
	Failpoint failpoint.Func
}

// Failpoints name the places where Config.Failpoint is consulted.
const (
	// FailpointPolicyCommitted: a policy stage transaction committed; its
	// outbox is not published and its input messages are not acked. The
	// relay of a later process publishes the outbox, and the messages are
	// redelivered to it after AckWait.
	FailpointPolicyCommitted = "policy.committed"
	// FailpointDuesPublished: due events were published and acknowledged
	// by JetStream, and the rows are not yet marked due. The transaction
	// rolls back, so the rows are published again (with the same
	// Nats-Msg-Id) by the next emission.
	FailpointDuesPublished = "due.published"
	// FailpointReleasePart: the release loop wrote a part of a release
	// and where it stopped, and has not committed. The transaction rolls
	// back; the next loop, here or in another process, applies the part.
	FailpointReleasePart = "release.part"
)

// validate fills in defaults and checks every field, naming the field in
// its errors.
func (c *Config) validate() error {
	if c.Pool == nil {
		return errors.New("Config.Pool is required")
	}
	if c.JS == nil {
		return errors.New("Config.JS is required")
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = host + "-" + strconv.Itoa(os.Getpid())
	}
	if c.Classifier == nil {
		c.Classifier = errclass.DefaultClassifier()
	}
	ints := []struct {
		name     string
		v        *int
		def, max int
	}{
		{"BatchSize", &c.BatchSize, DefaultBatchSize, 10_000},
		{"Emitters", &c.Emitters, DefaultEmitters, 64},
		{"ConsumeBatch", &c.ConsumeBatch, DefaultConsumeBatch, 10_000},
		{"MaxAckPending", &c.MaxAckPending, DefaultMaxAckPending, 1_000_000},
		{"ReleasePart", &c.ReleasePart, DefaultReleasePart, 100_000},
	}
	for _, f := range ints {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < 1 || *f.v > f.max {
			return fmt.Errorf("%s must be between 1 and %d, got %d", "Config."+f.name, f.max, *f.v)
		}
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"AckWait", &c.AckWait, DefaultAckWait},
		{"MaxIdle", &c.MaxIdle, DefaultMaxIdle},
		{"RedueAfter", &c.RedueAfter, DefaultRedueAfter},
		{"ReconcileInterval", &c.ReconcileInterval, DefaultReconcileInterval},
		{"MetricsInterval", &c.MetricsInterval, DefaultMetricsInterval},
		{"RelayInterval", &c.RelayInterval, DefaultRelayInterval},
		{"LockTimeout", &c.LockTimeout, DefaultLockTimeout},
	}
	for _, f := range durations {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < time.Millisecond {
			return fmt.Errorf("%s must be at least 1ms, got %s", "Config."+f.name, *f.v)
		}
	}
	if c.InboxRetention == 0 {
		c.InboxRetention = DefaultInboxRetention
	}
	if c.InboxRetention > 0 && c.InboxRetention < time.Hour {
		return fmt.Errorf("Config.InboxRetention must be at least 1h (it must outlast redeliveries), got %s", c.InboxRetention)
	}
	if c.AckWait < time.Second {
		return fmt.Errorf("Config.AckWait must be at least 1s, got %s", c.AckWait)
	}
	if c.RedueAfter <= streams.DuplicateWindow {
		return fmt.Errorf("Config.RedueAfter must be greater than the RETRIES duplicate window %s (a re-emission inside it would be dropped as a duplicate), got %s",
			streams.DuplicateWindow, c.RedueAfter)
	}
	if c.Shards == 0 {
		c.Shards = c.Streams.Shards
	}
	if err := contract.ValidateShards("Config.Shards", c.Shards, "Config.Shard", c.Shard); err != nil {
		return err
	}
	if c.Streams.Shards == 0 && c.Shards > 1 {
		c.Streams.Shards = c.Shards
	}
	if err := c.Streams.Validate(); err != nil {
		return fmt.Errorf("Config.Streams: %w", err)
	}
	return nil
}
