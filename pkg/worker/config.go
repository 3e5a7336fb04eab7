package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
	"github.com/retryd/retryd/pkg/internal/sdkconfig"
	"github.com/retryd/retryd/pkg/owner"
)

// Defaults of Config.
const (
	DefaultSource      = "retryd/worker"
	DefaultConcurrency = 4
	DefaultTimeout     = 5 * time.Minute
	DefaultAckWait     = 30 * time.Second
	DefaultGrace       = 5 * time.Second
	DefaultFetchWait   = 5 * time.Second
	// DefaultPendingLimit is how many failed and held facts a worker keeps
	// until their decision: a few hundred bytes to 1 MiB each.
	DefaultPendingLimit = owner.DefaultPendingLimit
	// DefaultRepublishAfter outlasts RETRIES' 2-minute duplicate window.
	DefaultRepublishAfter = owner.DefaultRepublishAfter
	// DueRouterDurable is the durable consumer on RETRIES that turns
	// retry.job.due.<id> into jobs.<job_type>; every worker process shares it.
	DueRouterDurable = "worker-due-router"
)

// Config configures a Worker. JS is required; everything else has a default.
type Config struct {
	// JS publishes outcomes and consumes jobs. The JOBS and RETRIES streams
	// must exist (streams.Ensure).
	JS jetstream.JetStream
	// Logger receives ids, types, attempts and classes; never payloads,
	// checkpoints or handler error messages. Nil discards the logs: a
	// library writes to the program's log only when asked to.
	Logger *slog.Logger
	// Source is the CloudEvents source of the outcomes this worker
	// publishes. Default "retryd/worker".
	Source string
	// ExecutorID names this worker instance on every failed, succeeded
	// and held fact it publishes (field executor), so an item's history
	// says which instance ran each attempt. At most 64 bytes of printable
	// text (contract.ValidateExecutor). Default: the host name, "-" and
	// the process id, e.g. "worker-7f9c-4242", with the host name
	// shortened so that the whole fits 64 bytes (a pod's host name is its
	// name). The scheduler must be upgraded first: an older one refuses
	// the field (docs/contract.md, "Upgrade order").
	ExecutorID string
	// Concurrency is how many jobs of each type run at once in this
	// process. Default 4.
	Concurrency int
	// MaxAckPending caps the jobs of one type in flight across every
	// process sharing the worker-<job_type> consumer. Default Concurrency;
	// raise it to Concurrency × processes when several workers share a type.
	MaxAckPending int
	// Timeout bounds a handler when the job carries no timeout_ms.
	// Default 5 minutes.
	Timeout time.Duration
	// Grace is how long a handler that overran its timeout may take to
	// return before the attempt is reported as a timeout anyway. Default 5s.
	Grace time.Duration
	// AckWait is the consumers' ack wait; running jobs send an in-progress
	// ack every AckWait/3 so the broker does not redeliver them. Default 30s.
	AckWait time.Duration
	// FetchWait is how long one pull waits for jobs. Stop takes up to this
	// long to end a pull. Default 5s.
	FetchWait time.Duration
	// Classifier classifies errors that are not *errclass.Error.
	// Default errclass.DefaultClassifier().
	Classifier *errclass.Classifier
	// DisableDueRouter turns off the worker-due-router consumer in this
	// process. At least one process must run it for retries to reach workers.
	DisableDueRouter bool
	// PendingLimit caps the failed and held facts this worker keeps, with
	// a subscription each, until it sees the scheduler's decision, so that
	// a purge of RETRIES before the scheduler reads one does not lose it.
	// At the limit the oldest is no longer kept (metric
	// retryd_worker_pending_evicted_total). -1 keeps none: every fact is
	// published as before, without a copy. Default 100000.
	PendingLimit int
	// RepublishAfter is how long a kept fact waits for its decision before
	// the worker looks for it on RETRIES: still there, it waits on (the
	// scheduler will read it); gone, it is published again with its
	// Nats-Msg-Id. It must be longer than RETRIES' duplicate window, which
	// Start reads: a purge does not clear the stream's record of the ids
	// it stored, so a copy inside the window would be dropped. Default
	// 3 minutes, or the window plus a minute if that is longer.
	RepublishAfter time.Duration
	// Registerer receives the worker's metrics. Default: a private registry.
	Registerer prometheus.Registerer
	// Now is the clock, for tests. Default time.Now.
	Now func() time.Time
}

func (c *Config) validate() error {
	if c.JS == nil {
		return errors.New("Config.JS is required")
	}
	if c.Source == "" {
		c.Source = DefaultSource
	}
	if len(c.Source) > 256 {
		return errors.New("Config.Source must be at most 256 characters")
	}
	if c.ExecutorID == "" {
		c.ExecutorID = owner.DefaultExecutorID(os.Hostname, os.Getpid())
	}
	if err := contract.ValidateExecutor("Config.ExecutorID", c.ExecutorID); err != nil {
		return err
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 1 || c.Concurrency > 10_000 {
		return fmt.Errorf("Config.Concurrency must be between 1 and 10000, got %d", c.Concurrency)
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = c.Concurrency
	}
	if c.MaxAckPending < c.Concurrency {
		return fmt.Errorf("Config.MaxAckPending must be at least Config.Concurrency (%d), got %d", c.Concurrency, c.MaxAckPending)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.FetchWait == 0 {
		c.FetchWait = DefaultFetchWait
	}
	if c.PendingLimit == 0 {
		c.PendingLimit = DefaultPendingLimit
	}
	if c.PendingLimit < -1 {
		return fmt.Errorf("Config.PendingLimit must be -1 (keep none) or more than 0, got %d", c.PendingLimit)
	}
	for name, d := range map[string]time.Duration{"Timeout": c.Timeout, "Grace": c.Grace, "AckWait": c.AckWait, "FetchWait": c.FetchWait, "RepublishAfter": c.RepublishAfter} {
		if d < 0 {
			return fmt.Errorf("Config.%s must not be negative, got %s", name, d)
		}
	}
	if c.AckWait < 300*time.Millisecond {
		return fmt.Errorf("Config.AckWait must be at least 300ms, got %s", c.AckWait)
	}
	if c.FetchWait < 100*time.Millisecond {
		return fmt.Errorf("Config.FetchWait must be at least 100ms, got %s", c.FetchWait)
	}
	sdkconfig.Fill(&c.Classifier, &c.Registerer, &c.Logger, &c.Now)
	return nil
}
