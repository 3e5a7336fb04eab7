// Package scheduler is retryd's scheduler: it turns failed facts into retry
// decisions, keeps every pending retry in Postgres and publishes due events
// when they come due.
//
// A Scheduler runs five loops:
//   - the policy stage consumes failed, succeeded and cancelled facts from
//     RETRIES (durable consumer "scheduler") and applies each, with its
//     inbox claim, history and outgoing events (outbox), in one
//     transaction;
//   - the due loop publishes the due events of rows whose next_attempt_at
//     passed, sleeping until the earliest one (no timer per retry);
//   - reconciliation recreates deleted streams and the consumer and
//     flushes the outbox, at start and periodically (the consumer runs on
//     internal/durable, which also recreates it soon after the client
//     reports it deleted);
//   - the release loop applies the parts left of large releases of held
//     items (releaseparts.go);
//   - a metrics loop refreshes the pending gauges.
//
// Several instances may run over one database: rows are claimed with FOR
// UPDATE SKIP LOCKED and every publish carries a deterministic Nats-Msg-Id.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/internal/promreg"
	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/internal/wait"
)

// Owner is the outbox owner and the inbox consumer name of the scheduler.
const Owner = "scheduler"

// Scheduler is the retry scheduler. Create it with New, run it with Start
// and stop it with Stop; Handler serves the operator API.
type Scheduler struct {
	cfg     Config
	log     zerolog.Logger
	metrics *metrics
	relay   *outbox.Relay

	// wake wakes the due loop early; plannedWake is the database time (unix
	// nanoseconds) it plans to wake at, or MaxInt64 while it is not asleep.
	wake        chan struct{}
	plannedWake atomic.Int64
	// releaseWake wakes the release loop when a release has parts left.
	releaseWake chan struct{}
	// lag is how far the policy stage is behind RETRIES (backlog.go).
	lag *applyLag

	mu      sync.Mutex
	started bool
	stopped bool
	stopErr error
	// consumers runs the policy stage's durable consumer (a new one at
	// each Start: a group that failed to start cannot start again).
	consumers *durable.Group
	cancel    context.CancelFunc
	loops     sync.WaitGroup
}

// New validates cfg and builds a Scheduler; it does no I/O.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With().Str("component", "scheduler").Str("instance", cfg.Instance).Logger()
	// The streams' sizes, for the stream-near-its-limit alert: the
	// scheduler is the one service every deployment runs.
	if _, err := promreg.Register(cfg.Registerer, streams.NewCollector(cfg.JS)); err != nil {
		return nil, fmt.Errorf("new scheduler: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: cfg.Pool, JS: cfg.JS, Owner: Owner, Logger: log, Batch: cfg.BatchSize,
		Interval: cfg.RelayInterval, Registerer: cfg.Registerer,
	})
	if err != nil {
		return nil, fmt.Errorf("new outbox relay: %w", err)
	}
	s := &Scheduler{
		cfg: cfg, log: log, metrics: m, relay: relay,
		wake: make(chan struct{}, 1), releaseWake: make(chan struct{}, 1),
		lag: newApplyLag(time.Now()),
	}
	s.plannedWake.Store(math.MaxInt64)
	return s, nil
}

// Start reconciles once (streams, outbox), starts the policy stage's
// consumer and the loops. It returns an error when that first
// reconciliation or the consumer fails; nothing then keeps running, and
// Start may be called again.
func (s *Scheduler) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started || s.stopped {
		s.mu.Unlock()
		return errors.New("scheduler already started or stopped")
	}
	s.started = true
	s.mu.Unlock()
	failed := func(err error) error {
		s.mu.Lock()
		s.started = false
		s.consumers = nil
		s.mu.Unlock()
		return err
	}

	if err := s.reconcile(ctx); err != nil {
		return failed(fmt.Errorf("start scheduler: %w", err))
	}
	if err := s.checkShards(ctx); err != nil {
		return failed(fmt.Errorf("start scheduler: %w", err))
	}
	consumers, err := s.newConsumers()
	if err != nil {
		return failed(fmt.Errorf("start scheduler: %w", err))
	}
	s.mu.Lock()
	s.consumers = consumers
	s.mu.Unlock()
	// The consumer starts before the relay, which cannot start twice: a
	// Start that failed here can be called again. What the policy stage
	// commits meanwhile kicks the relay, which publishes it once started.
	if err := consumers.Start(ctx); err != nil {
		return failed(fmt.Errorf("start scheduler: %w", err))
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if err := s.relay.Start(runCtx); err != nil {
		cancel()
		// Stop at once, without draining: the messages come back after
		// AckWait to whoever runs next.
		now, stop := context.WithCancel(context.Background())
		stop()
		_ = consumers.Drain(now)
		return failed(fmt.Errorf("start outbox relay: %w", err))
	}
	s.cancel = cancel
	s.goLoop(func() { s.runDueLoop(runCtx) })
	s.goLoop(func() { s.runReconcileLoop(runCtx) })
	s.goLoop(func() { s.runReleaseLoop(runCtx) })
	s.goLoop(func() { s.runMetricsLoop(runCtx) })
	s.log.Info().Int("batch_size", s.cfg.BatchSize).Int("consume_batch", s.cfg.ConsumeBatch).
		Int("max_ack_pending", s.cfg.MaxAckPending).Dur("ack_wait", s.cfg.AckWait).Dur("max_idle", s.cfg.MaxIdle).
		Dur("redue_after", s.cfg.RedueAfter).Msg("scheduler started")
	return nil
}

func (s *Scheduler) goLoop(f func()) {
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		f()
	}()
}

// Stop drains the consumer (in-flight messages are applied and acked),
// stops the loops and the relay and waits for them, or until ctx is done.
// It is idempotent.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped || !s.started {
		s.stopped = true
		err := s.stopErr
		s.mu.Unlock()
		return err
	}
	s.stopped = true
	consumers := s.consumers
	s.mu.Unlock()

	var errs []error
	// Draining hands the policy stage what the consumer already fetched;
	// it is applied and acked before the loops stop.
	if consumers != nil {
		if err := consumers.Drain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if s.cancel != nil {
		s.cancel()
	}
	if err := wait.Group(ctx, &s.loops); err != nil {
		errs = append(errs, fmt.Errorf("wait for loops: %w", err))
	}
	if err := s.relay.Stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("stop outbox relay: %w", err))
	}
	err := errors.Join(errs...)
	s.mu.Lock()
	s.stopErr = err
	s.mu.Unlock()
	s.log.Info().Err(err).Msg("scheduler stopped")
	return err
}

// wakeDueLoop wakes the due loop when at (database time) is earlier than
// the time it plans to wake at.
func (s *Scheduler) wakeDueLoop(atUnixNano int64) {
	if atUnixNano < s.plannedWake.Load() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}
