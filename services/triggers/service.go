package triggers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
)

// Service is the triggers service: it offers every admitted event to the
// matching triggers, launches runs, holds deliveries back by throttle and
// max concurrency, retries them when the scheduler says they are due, and
// frees concurrency slots when runs finish. It also serves the trigger
// definition API (Handler).
//
// Several instances may run against the same database and streams: the
// consumers are shared durables, and every delivery decision takes the
// trigger's row lock.
type Service struct {
	cfg       Config
	log       zerolog.Logger
	metrics   *metrics
	exprs     *exprEnv
	programs  *programCache
	relay     *outbox.Relay
	consumers *durable.Group

	mu        sync.Mutex
	started   bool
	stopped   bool
	runCtx    context.Context
	cancelRun context.CancelFunc
	quit      chan struct{}
	loops     sync.WaitGroup
}

// Failpoints (Config.failpoint, tests only): the places a crash test can
// make the process die, before and after the commit of a delivery or of
// a due.
const (
	failpointDeliverBeforeCommit = "deliver.before-commit"
	failpointDeliverAfterCommit  = "deliver.after-commit"
	failpointRetryBeforeCommit   = "retry.before-commit"
	failpointRetryAfterCommit    = "retry.after-commit"
	failpointRunFailedCommitted  = "run-failed.after-commit"
	failpointRelaunchCommitted   = "relaunch.after-commit"
)

// New checks the configuration and builds the service; Start runs it.
func New(cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("configure triggers: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	if err := cfg.Registerer.Register(newHeldCollector(cfg.Pool, cfg.Logger)); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	exprs, err := newExprEnv(cfg.CostLimit)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:      cfg,
		log:      cfg.Logger.With().Str("component", "triggers").Logger(),
		metrics:  m,
		exprs:    exprs,
		programs: newProgramCache(cfg.ProgramCacheSize),
	}
	if !cfg.noRelay {
		s.relay, err = outbox.NewRelay(outbox.RelayConfig{
			Pool: cfg.Pool, JS: cfg.JS, Owner: OutboxOwner, Logger: cfg.Logger,
			Interval: cfg.RelayInterval, Registerer: cfg.Registerer,
		})
		if err != nil {
			return nil, fmt.Errorf("create outbox relay: %w", err)
		}
	}
	spec := func(name, stream, description string, h durable.Handler, filters ...string) durable.Spec {
		return durable.Spec{Stream: stream, Handle: tracing.ConsumeHandler(name, h), Workers: cfg.Concurrency, Config: jetstream.ConsumerConfig{
			Durable:        name,
			Description:    description,
			FilterSubjects: filters,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        cfg.AckWait,
			// Never give up on a message: a pending delivery or retry must
			// not be lost to a long database outage.
			MaxDeliver:    -1,
			MaxAckPending: 64 * cfg.Concurrency,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		}}
	}
	s.consumers, err = durable.NewGroup(durable.Config{
		JS: cfg.JS, Logger: s.log, Streams: cfg.Streams, CheckInterval: cfg.CheckInterval,
		Malformed: m.malformed, Failed: m.errors,
		NakDelay: func(uint64) time.Duration { return cfg.NakDelay },
	},
		spec(ConsumerEvents, contract.StreamEvents, "retryd triggers: admitted events, offered to the triggers of their source and type",
			s.handleEvent, "events.>"),
		spec(ConsumerRetry, contract.StreamRetries, "retryd triggers: due trigger-delivery retries, each delivery tried again",
			s.handleDue, contract.RetryFilter(contract.KindEventTrigger, contract.Due)),
		spec(ConsumerRetryState, contract.StreamRetries,
			"retryd triggers: the scheduler's decisions on deliveries (scheduled, rescheduled, exhausted, cancelled), kept in step in Postgres",
			s.handleRetryState,
			contract.RetryFilter(contract.KindEventTrigger, contract.Scheduled),
			contract.RetryFilter(contract.KindEventTrigger, contract.Rescheduled),
			contract.RetryFilter(contract.KindEventTrigger, contract.Exhausted),
			contract.RetryFilter(contract.KindEventTrigger, contract.Cancelled)),
		spec(ConsumerRuns, contract.StreamRuns, "retryd triggers: what workflow engines report of runs (completed, failed, heartbeat, step)",
			s.handleRun,
			"runs.*."+contract.RunCompleted+".*", "runs.*."+contract.RunFailed+".*", "runs.*."+contract.RunHeartbeat+".*",
			"runs.*."+contract.RunStep+".*"),
		spec(ConsumerRunRetries, contract.StreamRetries, "retryd triggers: run retries (due, scheduled, rescheduled, exhausted, cancelled); a due launches the run again",
			s.handleRunRetry, runRetryFilters()...),
	)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Start creates the durable consumers, starts the outbox relay, the
// consumers and the reconciler, and marks the service ready.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("start triggers: already started")
	}
	s.started = true
	s.runCtx, s.cancelRun = context.WithCancel(context.WithoutCancel(ctx))
	s.quit = make(chan struct{})
	if s.relay != nil {
		if err := s.relay.Start(s.runCtx); err != nil {
			return fmt.Errorf("start outbox relay: %w", err)
		}
	}
	if err := s.consumers.Start(ctx); err != nil {
		s.stopLocked(ctx)
		return fmt.Errorf("start triggers: %w", err)
	}
	if s.cfg.ReconcileInterval > 0 || s.cfg.InboxRetention > 0 {
		s.loops.Add(1)
		go s.reconcileLoop()
	}
	if s.cfg.LeaseInterval > 0 {
		s.loops.Add(1)
		go s.leaseLoop()
	}
	if s.cfg.Health != nil {
		s.cfg.Health.SetReady(true)
	}
	s.log.Info().Int("concurrency", s.cfg.Concurrency).Msg("triggers started")
	return nil
}

// Stop drains the consumers (messages already fetched are handled and
// acked), waits for in-flight work, stops the reconciler and the relay and
// marks the service not ready. If ctx ends first, in-flight work is
// cancelled and its messages are redelivered later. Stop is idempotent.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(ctx)
}

func (s *Service) stopLocked(ctx context.Context) error {
	if !s.started || s.stopped {
		return nil
	}
	s.stopped = true
	if s.cfg.Health != nil {
		s.cfg.Health.SetReady(false)
	}
	var errs []error
	if err := s.consumers.Drain(ctx); err != nil {
		errs = append(errs, err)
	}
	close(s.quit)
	s.loops.Wait()
	if s.relay != nil {
		if err := s.relay.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop outbox relay: %w", err))
		}
	}
	s.cancelRun()
	s.log.Info().Msg("triggers stopped")
	return errors.Join(errs...)
}

// kick wakes the relay after a commit that wrote outbox rows.
func (s *Service) kick() {
	if s.relay != nil {
		s.relay.Kick()
	}
}
