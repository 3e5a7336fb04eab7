package ingress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/pkg/streams"
	"github.com/retryd/retryd/projections/outbox"
)

// ErrStopped is returned by Start after Stop.
var ErrStopped = errors.New("ingress: stopped")

// Service is one ingress instance. Several may run against the same
// database and NATS; they share the durable consumers and agree on every
// gate decision through row locks.
type Service struct {
	cfg     Config
	log     zerolog.Logger
	metrics *metrics
	types   *typeCache
	relay   *outbox.Relay
	handler http.Handler

	mu      sync.Mutex
	started bool
	stopped bool
	runCtx  context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// consMu guards the running consumers, which the reconciler replaces
	// when their consumer or stream was deleted.
	consMu   sync.Mutex
	draining bool
	running  []*runningConsumer
}

// runningConsumer is a durable consumer and its consume contexts.
type runningConsumer struct {
	spec     consumer
	contexts []jetstream.ConsumeContext
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
	}
	s.handler = s.routes()
	return s, nil
}

// Handler serves the intake and operator API (/v1/...). Mount it next to
// pkg/serve's /healthz, /readyz and /metrics.
func (s *Service) Handler() http.Handler { return s.handler }

// consumer is one durable consumer and the function that handles its
// messages.
type consumer struct {
	stream  string
	config  jetstream.ConsumerConfig
	handle  func(ctx context.Context, msg jetstream.Msg) error
	workers int
}

func (s *Service) consumers() []consumer {
	base := func(name string, filters ...string) jetstream.ConsumerConfig {
		return jetstream.ConsumerConfig{
			Durable:        name,
			FilterSubjects: filters,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        s.cfg.AckWait,
			MaxDeliver:     -1,
			MaxAckPending:  1000,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
		}
	}
	return []consumer{
		{stream: "INGEST", config: base(ConsumerGate, "ingest.*"), handle: s.handleIngest, workers: s.cfg.Concurrency},
		{stream: "RETRIES", config: base(ConsumerRetry, "retry.event.due.*"), handle: s.handleDue, workers: s.cfg.Concurrency},
		{stream: "RETRIES", config: base(ConsumerRetryState,
			"retry.event.scheduled.*", "retry.event.rescheduled.*", "retry.event.exhausted.*", "retry.event.cancelled.*"),
			handle: s.handleRetryState, workers: 1},
	}
}

// Start creates or updates the durable consumers and starts consuming,
// the outbox relay and the reconciler. ctx bounds the setup only; the
// service runs until Stop.
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
	for _, c := range s.consumers() {
		r := &runningConsumer{spec: c}
		s.consMu.Lock()
		s.running = append(s.running, r)
		s.consMu.Unlock()
		if err := s.consume(ctx, r); err != nil {
			return fmt.Errorf("ingress: %w", err)
		}
	}
	s.wg.Go(func() { s.reconcileLoop(s.runCtx) })
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
	s.consMu.Lock()
	s.draining = true
	var contexts []jetstream.ConsumeContext
	for _, r := range s.running {
		contexts = append(contexts, r.contexts...)
		r.contexts = nil
	}
	s.consMu.Unlock()
	for _, cc := range contexts {
		cc.Drain()
	}
	for _, cc := range contexts {
		select {
		case <-cc.Closed():
		case <-ctx.Done():
			cc.Stop()
		}
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	var errs []error
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

// consume creates or updates r's durable consumer and starts its consume
// contexts, replacing (stopping) any it had.
func (s *Service) consume(ctx context.Context, r *runningConsumer) error {
	c := r.spec
	cons, err := s.cfg.JS.CreateOrUpdateConsumer(ctx, c.stream, c.config)
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", c.config.Durable, err)
	}
	h := s.dispatch(c.config.Durable, c.handle)
	contexts := make([]jetstream.ConsumeContext, 0, c.workers)
	for range c.workers {
		cc, err := cons.Consume(h, jetstream.PullMaxMessages(8), jetstream.ConsumeErrHandler(s.consumeError(c.config.Durable)))
		if err != nil {
			for _, cc := range contexts {
				cc.Stop()
			}
			return fmt.Errorf("consume %s: %w", c.config.Durable, err)
		}
		contexts = append(contexts, cc)
	}
	s.consMu.Lock()
	defer s.consMu.Unlock()
	if s.draining {
		for _, cc := range contexts {
			cc.Stop()
		}
		return nil
	}
	for _, cc := range r.contexts {
		cc.Stop()
	}
	r.contexts = contexts
	return nil
}

// ensureConsumers recreates consumers that were deleted, with their
// stream when Config.Streams allows it (a deleted RETRIES stream would
// otherwise leave due events unread until a restart).
func (s *Service) ensureConsumers(ctx context.Context) error {
	s.consMu.Lock()
	running := append([]*runningConsumer(nil), s.running...)
	s.consMu.Unlock()
	var errs []error
	ensured := false
	for _, r := range running {
		_, err := s.cfg.JS.Consumer(ctx, r.spec.stream, r.spec.config.Durable)
		switch {
		case err == nil:
			continue
		case errors.Is(err, jetstream.ErrStreamNotFound):
			if s.cfg.Streams == nil {
				errs = append(errs, fmt.Errorf("stream %s is missing (Config.Streams is nil: not recreating it)", r.spec.stream))
				continue
			}
			if !ensured {
				if err := streams.Ensure(ctx, s.cfg.JS, *s.cfg.Streams); err != nil {
					errs = append(errs, fmt.Errorf("recreate streams: %w", err))
					continue
				}
				ensured = true
			}
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			errs = append(errs, fmt.Errorf("check consumer %s: %w", r.spec.config.Durable, err))
			continue
		}
		s.log.Warn().Str("consumer", r.spec.config.Durable).Str("stream", r.spec.stream).Msg("consumer missing, recreating it")
		if err := s.consume(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// failpoint consults Config.Failpoint.
func (s *Service) failpoint(point string) error {
	if s.cfg.Failpoint == nil {
		return nil
	}
	if err := s.cfg.Failpoint(point); err != nil {
		return &failpointError{point: point, err: err}
	}
	return nil
}

type failpointError struct {
	point string
	err   error
}

func (e *failpointError) Error() string { return "failpoint " + e.point + ": " + e.err.Error() }
func (e *failpointError) Unwrap() error { return e.err }

// inTx runs fn in a transaction.
func (s *Service) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.cfg.Pool, fn)
}

// naksDelay is how long a message that failed for a transient reason (the
// database is away) waits before it is delivered again.
func nakDelay(delivered uint64) time.Duration {
	return min(time.Duration(delivered)*time.Second, 30*time.Second)
}
