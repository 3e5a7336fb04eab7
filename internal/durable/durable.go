// Package durable runs the durable JetStream consumers of an owner of
// retries (ingress, triggers, or a service of your own that consumes
// RETRIES): it creates them, hands their messages to a handler on a
// bounded number of goroutines, settles each message by the handler's
// error, recreates consumers (and, when allowed, streams) that were
// deleted, and drains them on stop.
//
// The handler's error decides what happens to its message:
//
//   - nil: acked. A handler commits its change, with the inbox claim,
//     before it returns.
//   - wrapping contract.ErrInvalid or contract.ErrTooLarge: the message is
//     malformed; it is terminated with the reason and counted in
//     Config.Malformed.
//   - made by Reject: terminated with the reason but not counted as
//     malformed (the handler counted it, e.g. as a rejection).
//   - wrapping ErrAbandon: left alone, unacked, as if the process died
//     there; JetStream delivers it again after the ack wait. Tests use it
//     for failpoints.
//   - made by NakAfter: handed back for a delivery after the delay it
//     names, without being counted as a failure: the handler waits for
//     something that has not happened yet.
//   - anything else is transient (the database is away): the message is
//     handed back (nak) for a delivery after Config.NakDelay and counted in
//     Config.Failed.
//
// A consumer that was deleted, or lost with its stream, is created again
// with the same configuration every Config.CheckInterval, so an operator's
// mistake or a deleted stream does not leave the owner deaf until its next
// restart. Recreated consumers start where their configuration says
// (normally the start of the stream): owners must be idempotent, as
// retryd's are through the inbox and unique keys.
package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
)

// ErrAbandon, wrapped by a handler's error, leaves the message unacked as
// if the process had died at that point.
var ErrAbandon = errors.New("message abandoned")

// ErrStopped is returned by Start after Drain.
var ErrStopped = errors.New("durable consumers stopped")

// Reject wraps err so that the message is terminated without being
// counted as malformed: the handler already counted it.
func Reject(err error) error { return &rejectError{err: err} }

type rejectError struct{ err error }

func (e *rejectError) Error() string { return e.err.Error() }
func (e *rejectError) Unwrap() error { return e.err }

// NakAfter returns an error that hands the message back to be delivered
// again after delay. It is not a failure: the handler is waiting for
// another message to be applied first.
func NakAfter(delay time.Duration) error { return &nakAfterError{delay: delay} }

type nakAfterError struct{ delay time.Duration }

func (e *nakAfterError) Error() string { return "deliver again after " + e.delay.String() }

// Handler handles one message; see the package documentation for what its
// error does. ctx ends only when Drain gives up waiting.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// Spec is one durable consumer.
type Spec struct {
	// Stream is the stream the consumer reads.
	Stream string
	// Config is the consumer's configuration; Durable is required.
	Config jetstream.ConsumerConfig
	// Handle handles every message.
	Handle Handler
	// Workers is how many messages are handled at once. Default 1.
	Workers int
}

// Defaults of Config.
const (
	DefaultCheckInterval = 30 * time.Second
	// pullBatch is how many messages each worker asks for ahead.
	pullBatch = 8
)

// Config configures a Group. JS is required.
type Config struct {
	JS     jetstream.JetStream
	Logger zerolog.Logger
	// Streams, when set, lets the group recreate a deleted stream
	// (streams.CreateMissing with these options) before the consumers on it. Nil
	// leaves streams to the operator: consumers on a missing stream are
	// recreated once it is back.
	Streams *streams.Options
	// CheckInterval is how often the consumers are looked for and
	// recreated when missing. Default 30s.
	CheckInterval time.Duration
	// Malformed counts terminated malformed messages by consumer; its one
	// label is the consumer name. Nil counts nothing.
	Malformed *prometheus.CounterVec
	// Failed counts messages handed back for a later delivery, by consumer.
	// Nil counts nothing.
	Failed *prometheus.CounterVec
	// NakDelay says how long a message whose handling failed waits before
	// it is delivered again, from how often it was delivered. Default one
	// second per delivery, at most 30s.
	NakDelay func(delivered uint64) time.Duration
}

func (c *Config) validate(specs []Spec) error {
	if c.JS == nil {
		return errors.New("Config.JS is required")
	}
	if c.CheckInterval < 0 {
		return fmt.Errorf("Config.CheckInterval must not be negative, got %s", c.CheckInterval)
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.NakDelay == nil {
		c.NakDelay = func(delivered uint64) time.Duration {
			return min(time.Duration(delivered)*time.Second, 30*time.Second)
		}
	}
	if c.Streams != nil {
		if err := c.Streams.Validate(); err != nil {
			return fmt.Errorf("Config.Streams: %w", err)
		}
	}
	if len(specs) == 0 {
		return errors.New("no consumers to run")
	}
	seen := map[string]bool{}
	for i, s := range specs {
		key := s.Stream + "/" + s.Config.Durable
		switch {
		case s.Stream == "":
			return fmt.Errorf("Spec[%d].Stream is required", i)
		case s.Config.Durable == "":
			return fmt.Errorf("Spec[%d].Config.Durable is required", i)
		case s.Handle == nil:
			return fmt.Errorf("Spec[%d].Handle is required", i)
		case s.Workers < 0:
			return fmt.Errorf("Spec[%d].Workers must not be negative, got %d", i, s.Workers)
		case seen[key]:
			return fmt.Errorf("Spec[%d]: consumer %s is listed twice", i, key)
		}
		seen[key] = true
	}
	return nil
}

// Group runs a set of durable consumers. Build it with NewGroup, run it
// with Start and stop it with Drain.
type Group struct {
	cfg Config
	log zerolog.Logger

	// handleCtx is every handler's context; cancelled when Drain gives up.
	handleCtx    context.Context
	cancelHandle context.CancelFunc

	mu       sync.Mutex
	started  bool
	stopped  bool
	running  []*running
	stopLoop chan struct{}
	loop     sync.WaitGroup

	// gate and inflight let Drain wait for the handlers running: once
	// closed is set no handler starts.
	gate     sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
}

// running is one consumer and its consume contexts.
type running struct {
	spec     Spec
	contexts []jetstream.ConsumeContext
}

// NewGroup checks cfg and specs; nothing runs until Start.
func NewGroup(cfg Config, specs ...Spec) (*Group, error) {
	if err := cfg.validate(specs); err != nil {
		return nil, fmt.Errorf("durable consumers: %w", err)
	}
	g := &Group{cfg: cfg, log: cfg.Logger.With().Str("component", "consumers").Logger(), stopLoop: make(chan struct{})}
	g.handleCtx, g.cancelHandle = context.WithCancel(context.Background())
	for _, s := range specs {
		s.Workers = max(s.Workers, 1)
		g.running = append(g.running, &running{spec: s})
		if cfg.Malformed != nil {
			cfg.Malformed.WithLabelValues(s.Config.Durable)
		}
	}
	return g, nil
}

// Start creates or updates every consumer and starts consuming, then
// checks for deleted consumers every Config.CheckInterval. ctx bounds the
// setup only. If a consumer cannot be created, what was started is
// stopped and the error returned.
func (g *Group) Start(ctx context.Context) error {
	g.mu.Lock()
	switch {
	case g.stopped:
		g.mu.Unlock()
		return ErrStopped
	case g.started:
		g.mu.Unlock()
		return nil
	}
	g.started = true
	g.mu.Unlock()
	for _, r := range g.running {
		if err := g.consume(ctx, r); err != nil {
			_ = g.Drain(context.WithoutCancel(ctx))
			return err
		}
	}
	g.loop.Add(1)
	go g.checkLoop()
	return nil
}

// Drain stops the checks, drains every consumer (the messages already
// fetched are handled and settled) and waits for the handlers. If ctx
// ends first, the consumers are stopped without draining, the handlers'
// context is cancelled, and Drain waits for them to return and reports
// ctx's error; their messages are delivered again after the ack wait.
// Drain is idempotent.
func (g *Group) Drain(ctx context.Context) error {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return nil
	}
	g.stopped = true
	close(g.stopLoop)
	var contexts []jetstream.ConsumeContext
	for _, r := range g.running {
		contexts = append(contexts, r.contexts...)
		r.contexts = nil
	}
	g.mu.Unlock()
	g.loop.Wait()

	var err error
	for _, cc := range contexts {
		cc.Drain()
	}
	for _, cc := range contexts {
		select {
		case <-cc.Closed():
		case <-ctx.Done():
			cc.Stop()
			err = ctx.Err()
		}
	}
	g.gate.Lock()
	g.closed = true
	g.gate.Unlock()
	done := make(chan struct{})
	go func() { g.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		g.cancelHandle()
		<-done
		err = ctx.Err()
	}
	g.cancelHandle()
	if err != nil {
		return fmt.Errorf("drain consumers: %w", err)
	}
	return nil
}

// consume creates or updates r's consumer and starts its consume
// contexts, stopping any it had.
func (g *Group) consume(ctx context.Context, r *running) error {
	s := r.spec
	cons, err := g.cfg.JS.CreateOrUpdateConsumer(ctx, s.Stream, s.Config)
	if err != nil {
		return fmt.Errorf("create consumer %s on %s: %w", s.Config.Durable, s.Stream, err)
	}
	h := g.handler(s)
	onErr := g.consumeError(s.Config.Durable)
	contexts := make([]jetstream.ConsumeContext, 0, s.Workers)
	for range s.Workers {
		cc, err := cons.Consume(h, jetstream.PullMaxMessages(pullBatch), jetstream.ConsumeErrHandler(onErr))
		if err != nil {
			for _, cc := range contexts {
				cc.Stop()
			}
			return fmt.Errorf("consume %s: %w", s.Config.Durable, err)
		}
		contexts = append(contexts, cc)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
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

func (g *Group) checkLoop() {
	defer g.loop.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-g.stopLoop
		cancel()
	}()
	t := time.NewTicker(g.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.Ensure(ctx); err != nil && ctx.Err() == nil {
			g.log.Error().Err(err).Msg("ensure consumers")
		}
	}
}

// Ensure recreates the consumers that were deleted, and their streams
// when Config.Streams allows it. The group runs it every
// Config.CheckInterval; call it to check at once.
func (g *Group) Ensure(ctx context.Context) error {
	g.mu.Lock()
	if !g.started || g.stopped {
		g.mu.Unlock()
		return nil
	}
	list := append([]*running(nil), g.running...)
	g.mu.Unlock()
	var errs []error
	ensured := false
	for _, r := range list {
		s := r.spec
		_, err := g.cfg.JS.Consumer(ctx, s.Stream, s.Config.Durable)
		switch {
		case err == nil:
			continue
		case errors.Is(err, jetstream.ErrStreamNotFound):
			if g.cfg.Streams == nil {
				errs = append(errs, fmt.Errorf("stream %s is missing (Config.Streams is nil: not recreating it)", s.Stream))
				continue
			}
			if !ensured {
				if _, err := streams.CreateMissing(ctx, g.cfg.JS, *g.cfg.Streams); err != nil {
					errs = append(errs, fmt.Errorf("recreate streams: %w", err))
					continue
				}
				ensured = true
			}
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			errs = append(errs, fmt.Errorf("check consumer %s: %w", s.Config.Durable, err))
			continue
		}
		g.log.Warn().Str("consumer", s.Config.Durable).Str("stream", s.Stream).Msg("consumer missing, recreating it")
		if err := g.consume(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// handler runs the spec's handler on one message and settles it.
func (g *Group) handler(s Spec) jetstream.MessageHandler {
	consumer := s.Config.Durable
	log := g.log.With().Str("consumer", consumer).Logger()
	return func(msg jetstream.Msg) {
		g.gate.RLock()
		if g.closed {
			// Stopped without a drain: delivered again after the ack wait.
			g.gate.RUnlock()
			return
		}
		g.inflight.Add(1)
		g.gate.RUnlock()
		defer g.inflight.Done()
		g.settle(consumer, log, msg, s.Handle(g.handleCtx, msg))
	}
}

func (g *Group) settle(consumer string, log zerolog.Logger, msg jetstream.Msg, err error) {
	var reject *rejectError
	var later *nakAfterError
	switch {
	case err == nil:
		if err := msg.Ack(); err != nil {
			// The message comes back and the handler finds it applied.
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("ack failed")
		}
	case errors.Is(err, ErrAbandon):
		log.Warn().Str("subject", msg.Subject()).Msg("message abandoned unacked")
	case errors.As(err, &later):
		log.Debug().Str("subject", msg.Subject()).Dur("retry_in", later.delay).Msg("message handed back until it can be applied")
		if err := msg.NakWithDelay(later.delay); err != nil {
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("nak failed")
		}
	case errors.As(err, &reject) || errors.Is(err, contract.ErrInvalid) || errors.Is(err, contract.ErrTooLarge):
		reason := contract.LogReason(err)
		if reject == nil && g.cfg.Malformed != nil {
			g.cfg.Malformed.WithLabelValues(consumer).Inc()
		}
		log.Warn().Str("subject", msg.Subject()).Str("reason", reason).Msg("message terminated")
		if err := msg.TermWithReason(reason); err != nil {
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("term failed")
		}
	default:
		if g.cfg.Failed != nil {
			g.cfg.Failed.WithLabelValues(consumer).Inc()
		}
		var delivered uint64 = 1
		if md, mdErr := msg.Metadata(); mdErr == nil {
			delivered = md.NumDelivered
		}
		delay := g.cfg.NakDelay(delivered)
		log.Error().Err(err).Str("subject", msg.Subject()).Uint64("delivered", delivered).Dur("retry_in", delay).
			Msg("message failed, delivering it again later")
		if err := msg.NakWithDelay(delay); err != nil {
			log.Warn().Err(err).Str("subject", msg.Subject()).Msg("nak failed")
		}
	}
}

func (g *Group) consumeError(consumer string) jetstream.ConsumeErrHandler {
	log := g.log.With().Str("consumer", consumer).Logger()
	return func(_ jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted) {
			log.Error().Err(err).Msg("consume error")
			return
		}
		log.Debug().Err(err).Msg("consume error")
	}
}
