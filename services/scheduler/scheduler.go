// Package scheduler is retryd's scheduler: it turns failed facts into retry
// decisions, keeps every pending retry in Postgres and publishes due events
// when they come due.
//
// A Scheduler runs four loops:
//   - the policy stage consumes failed, succeeded and cancelled facts from
//     RETRIES (durable consumer "scheduler") and applies each, with its
//     inbox claim, history and outgoing events (outbox), in one
//     transaction;
//   - the due loop publishes the due events of rows whose next_attempt_at
//     passed, sleeping until the earliest one (no timer per retry);
//   - reconciliation recreates deleted streams and the consumer and
//     flushes the outbox, at start and periodically;
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

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/wait"
	"github.com/retryd/retryd/projections/outbox"
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
	// reconcileNow asks for a reconciliation before the next interval.
	reconcileNow chan struct{}
	// inbound carries messages from the consume callback to the policy
	// stage worker.
	inbound chan jetstream.Msg
	// inHand is every message handed to this instance and not finished
	// with; runProgressLoop keeps them from redelivery.
	inHand *inHand
	// lag is how far the policy stage is behind RETRIES (backlog.go).
	lag *applyLag

	mu       sync.Mutex
	started  bool
	stopped  bool
	stopErr  error
	consumer jetstream.ConsumeContext
	// consumed is set once a consumer ran: a consumer missing after that
	// was deleted.
	consumed bool
	// abort unblocks the consume callback when Stop gives up waiting.
	abort      chan struct{}
	cancel     context.CancelFunc
	loops      sync.WaitGroup
	workerDone chan struct{}
}

// New validates cfg and builds a Scheduler; it does no I/O.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With().Str("component", "scheduler").Str("instance", cfg.Instance).Logger()
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
		wake:         make(chan struct{}, 1),
		reconcileNow: make(chan struct{}, 1),
		inbound:      make(chan jetstream.Msg, cfg.ConsumeBatch),
		inHand:       newInHand(),
		lag:          newApplyLag(time.Now()),
		abort:        make(chan struct{}),
		workerDone:   make(chan struct{}),
	}
	s.plannedWake.Store(math.MaxInt64)
	return s, nil
}

// Start reconciles once (streams, consumer, outbox) and starts the loops.
// It returns an error when that first reconciliation fails; the loops then
// keep running on a context that only Stop cancels.
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
		s.mu.Unlock()
		return err
	}

	if err := s.reconcile(ctx); err != nil {
		return failed(fmt.Errorf("start scheduler: %w", err))
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if err := s.relay.Start(runCtx); err != nil {
		cancel()
		s.stopConsumer()
		return failed(fmt.Errorf("start outbox relay: %w", err))
	}
	s.cancel = cancel
	go s.runPolicyStage(runCtx)
	s.goLoop(func() { s.runDueLoop(runCtx) })
	s.goLoop(func() { s.runReconcileLoop(runCtx) })
	s.goLoop(func() { s.runMetricsLoop(runCtx) })
	s.goLoop(func() { s.runProgressLoop(runCtx) })
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
	cc := s.consumer
	s.consumer = nil
	s.mu.Unlock()

	var errs []error
	if cc != nil {
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("drain consumer: %w", ctx.Err()))
		}
	}
	// The consume callback no longer runs (or was given up on): the worker
	// applies what is queued and exits.
	close(s.abort)
	select {
	case <-s.workerDone:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("wait for policy stage: %w", ctx.Err()))
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

func (s *Scheduler) requestReconcile() {
	select {
	case s.reconcileNow <- struct{}{}:
	default:
	}
}
