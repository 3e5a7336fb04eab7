package triggers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/projections/outbox"
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
	cfg      Config
	log      zerolog.Logger
	metrics  *metrics
	exprs    *exprEnv
	programs *programCache
	relay    *outbox.Relay

	mu        sync.Mutex
	started   bool
	stopped   bool
	consumers []*consumer
	runCtx    context.Context
	cancelRun context.CancelFunc
	quit      chan struct{}
	workers   sync.WaitGroup
	loops     sync.WaitGroup
}

// handler handles one message. A nil error acks it; an error wrapping
// contract.ErrInvalid or contract.ErrTooLarge terminates it; errCrashed
// leaves it alone (a test failpoint acting as a crash); any other error
// naks it for a redelivery after Config.NakDelay.
type handler func(ctx context.Context, msg jetstream.Msg) error

type consumer struct {
	name    string
	stream  string
	filters []string
	handle  handler
	cc      jetstream.ConsumeContext
	work    chan jetstream.Msg
}

// errCrashed is returned by failpoints: the process "died" at that point.
var errCrashed = errors.New("failpoint: crashed")

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
	s.consumers = []*consumer{
		{name: ConsumerEvents, stream: contract.StreamEvents, filters: []string{"events.>"}, handle: s.handleEvent},
		{name: ConsumerRetry, stream: contract.StreamRetries, filters: []string{contract.RetryFilter(contract.KindEventTrigger, contract.Due)}, handle: s.handleDue},
		{name: ConsumerRetryState, stream: contract.StreamRetries, filters: []string{
			contract.RetryFilter(contract.KindEventTrigger, contract.Scheduled),
			contract.RetryFilter(contract.KindEventTrigger, contract.Rescheduled),
			contract.RetryFilter(contract.KindEventTrigger, contract.Exhausted),
			contract.RetryFilter(contract.KindEventTrigger, contract.Cancelled),
		}, handle: s.handleRetryState},
		{name: ConsumerRuns, stream: contract.StreamRuns, filters: []string{"runs.*." + contract.RunCompleted + ".*", "runs.*." + contract.RunFailed + ".*"}, handle: s.handleRunFinished},
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
	for _, c := range s.consumers {
		if err := s.startConsumer(ctx, c); err != nil {
			s.stopLocked(ctx)
			return err
		}
	}
	if s.cfg.ReconcileInterval > 0 || s.cfg.InboxRetention > 0 {
		s.loops.Add(1)
		go s.reconcileLoop()
	}
	if s.cfg.Health != nil {
		s.cfg.Health.SetReady(true)
	}
	s.log.Info().Int("workers", s.cfg.Workers).Msg("triggers started")
	return nil
}

func (s *Service) startConsumer(ctx context.Context, c *consumer) error {
	cons, err := s.cfg.JS.CreateOrUpdateConsumer(ctx, c.stream, jetstream.ConsumerConfig{
		Durable:        c.name,
		FilterSubjects: c.filters,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        s.cfg.AckWait,
		// Never give up on a message: a pending delivery or retry must not
		// be lost to a long database outage.
		MaxDeliver:    -1,
		MaxAckPending: 64 * s.cfg.Workers,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", c.name, err)
	}
	c.work = make(chan jetstream.Msg)
	for range s.cfg.Workers {
		s.workers.Add(1)
		go s.worker(c)
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		select {
		case c.work <- msg:
		case <-s.quit:
			// Stopping without a drain: the message is redelivered after
			// AckWait, to this or another instance.
		}
	}, jetstream.PullMaxMessages(2*s.cfg.Workers))
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.name, err)
	}
	c.cc = cc
	return nil
}

func (s *Service) worker(c *consumer) {
	defer s.workers.Done()
	for {
		select {
		case msg := <-c.work:
			s.dispatch(c, msg)
		case <-s.quit:
			return
		}
	}
}

func (s *Service) dispatch(c *consumer, msg jetstream.Msg) {
	err := c.handle(s.runCtx, msg)
	switch {
	case err == nil:
		if err := msg.Ack(); err != nil {
			s.log.Warn().Err(err).Str("consumer", c.name).Str("subject", msg.Subject()).Msg("ack failed; the message will be redelivered and found applied")
		}
	case errors.Is(err, contract.ErrInvalid), errors.Is(err, contract.ErrTooLarge):
		s.metrics.malformed.WithLabelValues(c.name).Inc()
		s.log.Warn().Str("consumer", c.name).Str("subject", msg.Subject()).Str("reason", err.Error()).Msg("malformed message terminated")
		if err := msg.TermWithReason("malformed: " + truncate(err.Error(), 200)); err != nil {
			s.log.Warn().Err(err).Str("consumer", c.name).Msg("term failed")
		}
	case errors.Is(err, errCrashed):
		s.log.Warn().Str("consumer", c.name).Str("subject", msg.Subject()).Msg("failpoint: message left unacked")
	default:
		s.metrics.errors.WithLabelValues(c.name).Inc()
		s.log.Error().Err(err).Str("consumer", c.name).Str("subject", msg.Subject()).Msg("handling failed; redelivering")
		if err := msg.NakWithDelay(s.cfg.NakDelay); err != nil {
			s.log.Warn().Err(err).Str("consumer", c.name).Msg("nak failed")
		}
	}
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
	for _, c := range s.consumers {
		if c.cc != nil {
			c.cc.Drain()
		}
	}
	for _, c := range s.consumers {
		if c.cc == nil {
			continue
		}
		select {
		case <-c.cc.Closed():
		case <-ctx.Done():
			c.cc.Stop()
			errs = append(errs, fmt.Errorf("drain consumer %s: %w", c.name, ctx.Err()))
		}
	}
	close(s.quit)
	done := make(chan struct{})
	go func() { s.workers.Wait(); s.loops.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.cancelRun()
		<-done
	}
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

// fail runs a test failpoint.
func (s *Service) fail(name string) error {
	if s.cfg.failpoint == nil {
		return nil
	}
	if err := s.cfg.failpoint(name); err != nil {
		return fmt.Errorf("%s: %w", name, errCrashed)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
