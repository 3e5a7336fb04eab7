package ingress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
)

// ErrStopped is returned by Start after Stop.
var ErrStopped = errors.New("ingress: stopped")

// Service is one ingress instance. Several may run against the same
// database and NATS; they share the durable consumers and agree on every
// gate decision through row locks.
type Service struct {
	cfg       Config
	log       zerolog.Logger
	metrics   *metrics
	types     *typeCache
	relay     *outbox.Relay
	consumers *durable.Group
	handler   http.Handler
	limiter   *callerLimiter // nil: no intake rate limit
	intake    http.Handler   // intake routes only
	operator  http.Handler   // operator routes only

	mu      sync.Mutex
	started bool
	stopped bool
	runCtx  context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// releaseKick wakes the releaser (releaseLoop).
	releaseKick chan struct{}
}

// New validates cfg, fills its defaults and builds a Service. The HTTP
// handler works at once; Start runs the consumers, the relay and the
// reconciler.
func New(cfg Config) (*Service, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ingress: %w", err)
	}
	m, err := newMetrics(cfg.Registerer, cfg.MaxSourceLabels)
	if err != nil {
		return nil, fmt.Errorf("ingress: register metrics: %w", err)
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool:       cfg.Pool,
		JS:         cfg.JS,
		Owner:      OutboxOwner,
		Logger:     cfg.Logger,
		Interval:   cfg.RelayInterval,
		Registerer: cfg.Registerer,
	})
	if err != nil {
		return nil, fmt.Errorf("ingress: new outbox relay: %w", err)
	}
	s := &Service{
		cfg:     cfg,
		log:     cfg.Logger.With().Str("component", "ingress").Logger(),
		metrics: m,
		types:   newTypeCache(cfg.Pool, cfg.SourceCacheTTL, cfg.Now),
		relay:   relay,

		releaseKick: make(chan struct{}, 1),
	}
	s.consumers, err = durable.NewGroup(durable.Config{
		JS: cfg.JS, Logger: s.log, Streams: cfg.Streams, CheckInterval: cfg.ReconcileInterval, Malformed: m.malformed,
	}, s.consumerSpecs()...)
	if err != nil {
		return nil, fmt.Errorf("ingress: %w", err)
	}
	if cfg.IntakeRate > 0 {
		s.limiter = newCallerLimiter(cfg.IntakeRate, cfg.IntakeBurst, cfg.MaxIntakeCallers)
	}
	s.handler = s.mount(endpoints)
	s.intake = s.mount(intakeEndpoints)
	s.operator = s.mount(operatorEndpoints)
	return s, nil
}

// Handler serves the intake and operator API (/v1/...). Mount it next to
// internal/serve's /healthz, /readyz and /metrics, behind a serve.Guard:
// each route answers only a principal with the role it names.
func (s *Service) Handler() http.Handler { return s.handler }

// IntakeHandler serves the intake routes alone, for a listener producers
// reach; every other path is 404.
func (s *Service) IntakeHandler() http.Handler { return s.intake }

// OperatorHandler serves the operator routes alone, for a listener only
// operators and the gateway reach; intake paths are 404.
func (s *Service) OperatorHandler() http.Handler { return s.operator }

func (s *Service) consumerSpecs() []durable.Spec {
	return []durable.Spec{
		s.gateSpec(),
		{Stream: contract.StreamRetries, HandleBatch: s.handleDues, Workers: 1, Batch: consumeBatch,
			Progress: s.cfg.AckWait / 4, Config: s.consumerConfig(ConsumerRetry,
				"retryd ingress: due event retries, each event evaluated at its source gate again",
				contract.RetryFilter(contract.KindEvent, contract.Due))},
		{Stream: contract.StreamRetries, Handle: tracing.ConsumeHandler(ConsumerRetryState, s.handleRetryState), Workers: 1,
			Config: s.consumerConfig(ConsumerRetryState,
				"retryd ingress: the scheduler's decisions on deferred events (scheduled, rescheduled, exhausted, cancelled), kept in step in Postgres",
				contract.RetryFilter(contract.KindEvent, contract.Scheduled), contract.RetryFilter(contract.KindEvent, contract.Rescheduled),
				contract.RetryFilter(contract.KindEvent, contract.Exhausted), contract.RetryFilter(contract.KindEvent, contract.Cancelled))},
	}
}

// consumerConfig is the durable consumer name of ingress, on filters;
// description is what `nats consumer info` shows of it.
func (s *Service) consumerConfig(name, description string, filters ...string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        name,
		Description:    description,
		FilterSubjects: filters,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        s.cfg.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  1000,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
}

// gateSpec is the gate's consumer: one batch at a time, so the gate sees
// INGEST in stream order (see handleIngest; the due consumer runs the
// same way, see handleDues). In-progress acks keep a batch
// the database is slow to decide from being delivered again meanwhile.
func (s *Service) gateSpec() durable.Spec {
	return durable.Spec{Stream: contract.StreamIngest, HandleBatch: s.handleIngest, Workers: 1, Batch: consumeBatch,
		Progress: s.cfg.AckWait / 4, Config: s.consumerConfig(ConsumerGate,
			"retryd ingress: the source gate, admitting INGEST's events to EVENTS or holding them back", "ingest.*")}
}

// consumeBatch bounds the messages the gate and the due consumer decide
// together; a source's share of a batch is one transaction.
const consumeBatch = 100

// Start creates or updates the durable consumers and starts consuming,
// the outbox relay and the reconciler. ctx bounds the setup only; the
// service runs until Stop. Deleted consumers (and, with Config.Streams,
// streams) are recreated every ReconcileInterval.
func (s *Service) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return ErrStopped
	case s.started:
		return nil
	}
	s.runCtx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if err != nil {
			s.stopLocked(context.WithoutCancel(ctx))
		}
	}()
	// The relay is stopped by Stop, after the consumers, not by cancelling
	// runCtx: that would abandon a batch in flight.
	if err := s.relay.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("ingress: start outbox relay: %w", err)
	}
	if err := s.consumers.Start(ctx); err != nil {
		return fmt.Errorf("ingress: %w", err)
	}
	s.wg.Go(func() { s.reconcileLoop(s.runCtx) })
	s.wg.Go(func() { s.releaseLoop(s.runCtx) })
	s.started = true
	if s.cfg.Health != nil {
		s.cfg.Health.SetReady(true)
	}
	s.log.Info().Int("concurrency", s.cfg.Concurrency).Msg("ingress started")
	return nil
}

// Stop marks the instance not ready, drains the consumers (messages in
// hand are finished and acked), stops the reconciler and the relay and
// publishes what the outbox still holds. It is idempotent; ctx bounds the
// wait, after which consumers are stopped without draining.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	return s.stopLocked(ctx)
}

func (s *Service) stopLocked(ctx context.Context) error {
	s.stopped = true
	if s.cfg.Health != nil {
		s.cfg.Health.SetReady(false)
	}
	var errs []error
	if err := s.consumers.Drain(ctx); err != nil {
		errs = append(errs, err)
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	if err := s.relay.Stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("stop outbox relay: %w", err))
	}
	if s.started {
		// What the drained handlers committed last, and anything the relay
		// left, is published now rather than by the next instance.
		if _, err := s.relay.Flush(ctx); err != nil {
			errs = append(errs, fmt.Errorf("flush outbox: %w", err))
		}
	}
	s.log.Info().Msg("ingress stopped")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ingress: stop: %w", err)
	}
	return nil
}

// inTx runs fn in a transaction.
func (s *Service) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.cfg.Pool, fn)
}
