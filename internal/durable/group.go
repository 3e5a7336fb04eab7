package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/streams"
)

// Group runs a set of durable consumers. Build it with NewGroup, run it
// with Start and stop it with Drain.
type Group struct {
	cfg Config
	log zerolog.Logger

	// handleCtx is every handler's context; cancelled when Drain gives up
	// (and, for the in-progress loops, when Drain ends).
	handleCtx    context.Context
	cancelHandle context.CancelFunc

	mu       sync.Mutex
	started  bool
	stopped  bool
	running  []*running
	stopLoop chan struct{}
	loop     sync.WaitGroup
	// checkNow asks checkLoop for a check before the next interval.
	checkNow chan struct{}

	// gate and inflight let Drain wait for the handlers running: once
	// closed is set no handler starts.
	gate     sync.RWMutex
	closed   bool
	inflight sync.WaitGroup

	// abort is closed once the consume contexts have ended (drained or
	// given up on): a consume callback blocked on a full batch queue
	// returns, and the batch workers handle what is queued and exit.
	abort    chan struct{}
	batchers sync.WaitGroup
	progress sync.WaitGroup
}

// running is one consumer and its consume contexts.
type running struct {
	spec     Spec
	contexts []jetstream.ConsumeContext
	// queue and hand are batch mode's: the messages delivered and not yet
	// taken into a batch, and every message handed over and not settled.
	queue chan jetstream.Msg
	hand  *inHand
}

// NewGroup checks cfg and specs; nothing runs until Start.
func NewGroup(cfg Config, specs ...Spec) (*Group, error) {
	if err := cfg.validate(specs); err != nil {
		return nil, fmt.Errorf("durable consumers: %w", err)
	}
	g := &Group{
		cfg: cfg, log: cfg.Logger.With().Str("component", "consumers").Logger(),
		stopLoop: make(chan struct{}), checkNow: make(chan struct{}, 1), abort: make(chan struct{}),
	}
	g.handleCtx, g.cancelHandle = context.WithCancel(context.Background())
	for _, s := range specs {
		s.Workers = max(s.Workers, 1)
		r := &running{spec: s}
		if s.batchMode() {
			if s.Batch == 0 {
				s.Batch = DefaultBatch
				r.spec.Batch = DefaultBatch
			}
			r.queue = make(chan jetstream.Msg, s.Batch)
			r.hand = newInHand()
		}
		g.running = append(g.running, r)
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
	// Batch workers first: a consume callback blocks until one takes its
	// message.
	for _, r := range g.running {
		if r.spec.batchMode() {
			g.startBatch(r)
		}
	}
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
	close(g.abort)
	g.gate.Lock()
	g.closed = true
	g.gate.Unlock()
	done := make(chan struct{})
	go func() {
		g.inflight.Wait()
		g.batchers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		g.cancelHandle()
		<-done
		err = ctx.Err()
	}
	g.cancelHandle()
	g.progress.Wait()
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
	opts := []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(pullBatch), jetstream.ConsumeErrHandler(g.consumeError(s.Config.Durable))}
	// A batch consumer pulls with one context for all its workers: they
	// share its queue.
	pulls := s.Workers
	if s.batchMode() {
		h, pulls = g.enqueue(r), 1
		pull := s.Batch
		if s.Config.MaxAckPending > 0 {
			pull = min(pull, s.Config.MaxAckPending)
		}
		opts[0] = jetstream.PullMaxMessages(pull)
	}
	expiry := DefaultExpiry
	if s.Expiry > 0 {
		expiry = max(s.Expiry, time.Second)
	}
	opts = append(opts, jetstream.PullExpiry(expiry))
	contexts := make([]jetstream.ConsumeContext, 0, pulls)
	for range pulls {
		cc, err := cons.Consume(h, opts...)
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
	// A check that failed is tried again sooner than the interval (1s,
	// doubling up to it): a consumer deleted a moment ago cannot always be
	// created at once (the server is still removing its store).
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-g.checkNow:
			// Not at once: the server removes a deleted consumer's or
			// stream's store after it answered the delete, and one created
			// again meanwhile can fail or break.
			retry.Reset(earlyCheckDelay)
			continue
		case <-retry.C:
		}
		err := g.Ensure(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = 0
			retry.Stop()
			continue
		}
		g.log.Error().Err(err).Msg("ensure consumers")
		backoff = min(max(2*backoff, time.Second), g.cfg.CheckInterval)
		retry.Reset(backoff)
	}
}

// earlyCheckDelay is how long after the client reported a consumer
// deleted (or its heartbeats missed) the group checks it.
const earlyCheckDelay = 500 * time.Millisecond

// requestCheck asks for a check before the next interval.
func (g *Group) requestCheck() {
	select {
	case g.checkNow <- struct{}{}:
	default:
	}
}

// Ensure recreates the consumers that were deleted, and their streams
// when Config.Streams allows it, and consumes again from a consumer whose
// consume contexts ended. The group runs it every Config.CheckInterval
// and when the client reports a consumer deleted; call it to check at
// once.
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
			if !g.ended(r) {
				continue
			}
			g.log.Warn().Str("consumer", s.Config.Durable).Str("stream", s.Stream).Msg("consume ended, consuming again")
			if err := g.consume(ctx, r); err != nil {
				errs = append(errs, err)
			}
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

// ended reports whether one of r's consume contexts has ended: the client
// ends it when the consumer is deleted, even if it was recreated since.
func (g *Group) ended(r *running) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	for _, cc := range r.contexts {
		select {
		case <-cc.Closed():
			return true
		default:
		}
	}
	return false
}
