package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/errclass"
)

// pullBackoff is the pause after a failed pull of dues.
const pullBackoff = time.Second

// stopGrace is how long Stop waits, once its deadline passed, for
// cancelled handlers to return.
const stopGrace = 5 * time.Second

// ErrStarted is returned by Start after Start or Stop.
var ErrStarted = errors.New("owner already started")

// Handler runs one attempt of an item. Its error decides the fact:
//   - nil: retry.<kind>.succeeded.<id>;
//   - a *HoldError (Hold): retry.<kind>.held.<id>, the item waits without
//     using a retry;
//   - an *errclass.Error: its class, retry-after hint and non-retryable
//     flag; any other error is classified by Config.Classifier;
//   - a panic: class temporary.
//
// An attempt may run more than once (a crash between its effect and its
// fact): key effects by it.IdempotencyKey() or the item's id.
type Handler func(ctx context.Context, it *Item) error

// Owner is the owner half of the contract (docs/contract.md) for one kind:
// it runs the first attempt of an item when the program asks (Run), reports
// each attempt's fact, consumes retry.<kind>.due.<id> to run the later
// attempts the scheduler decides, and keeps every failure and hold until
// its decision (Reporter). Build it with New, then Start; Stop drains it.
type Owner struct {
	cfg   Config
	log   *slog.Logger
	m     *ownerMetrics
	rm    *ReporterMetrics
	facts Facts

	mu       sync.Mutex
	started  bool
	reporter *Reporter
	iter     jetstream.MessagesContext

	// hardCtx ends running handlers and publishes: Stop's deadline passed.
	hardCtx    context.Context
	hardCancel context.CancelFunc
	// stopping and stopCh tell the pull loop that Stop, not an error,
	// ended its iterator.
	stopping atomic.Bool
	stopCh   chan struct{}
	loopDone chan struct{}
	inflight sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
}

// ConsumerName is the durable consumer of a kind's dues on RETRIES,
// "owner-<kind>", shared by every instance of the owner.
func ConsumerName(kind string) string { return "owner-" + kind }

// New validates cfg and fills its defaults.
func New(cfg Config) (*Owner, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new owner: %w", err)
	}
	m, err := newOwnerMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("new owner: %w", err)
	}
	rm, err := NewReporterMetrics(cfg.Registerer, "owner")
	if err != nil {
		return nil, fmt.Errorf("new owner: %w", err)
	}
	log := cfg.Logger.With(slog.String("component", "owner"), slog.String("kind", cfg.Kind))
	o := &Owner{cfg: cfg, log: log, m: m, rm: rm, loopDone: make(chan struct{}), stopCh: make(chan struct{}),
		facts: Facts{Source: cfg.Source, Executor: cfg.ExecutorID, Now: cfg.Now, Logger: log}}
	o.hardCtx, o.hardCancel = context.WithCancel(context.Background())
	return o, nil
}

// Start creates or updates the durable consumer owner-<kind> on RETRIES
// (filter retry.<kind>.due.>) and starts running the dues. ctx bounds the
// set-up only; Stop ends the owner.
func (o *Owner) Start(ctx context.Context) error {
	o.mu.Lock()
	if o.started {
		o.mu.Unlock()
		return ErrStarted
	}
	o.started = true
	o.mu.Unlock()
	rep, err := NewReporter(ctx, ReporterConfig{
		JS: o.cfg.JS, Kind: o.cfg.Kind, PendingLimit: o.cfg.PendingLimit, RepublishAfter: o.cfg.RepublishAfter,
		Metrics: o.rm, Logger: o.log, Now: o.cfg.Now,
	})
	if err != nil {
		return fmt.Errorf("start owner: %w", err)
	}
	if _, err := o.openIter(ctx); err != nil {
		rep.Close()
		return fmt.Errorf("start owner: %w", err)
	}
	o.mu.Lock()
	o.reporter = rep
	o.mu.Unlock()
	go o.consume()
	o.log.Info("owner started", slog.Int("concurrency", o.cfg.Concurrency), slog.Duration("republish_after", rep.RepublishAfter()))
	return nil
}

// consume runs each due in a slot of Concurrency until Stop. A consumer
// deleted under the owner (`nats consumer rm`, a restored stream) ends
// its iterator: it is created again, and its dues are delivered again
// from the stream (a due already reported repeats its fact, with the same
// Nats-Msg-Id).
func (o *Owner) consume() {
	defer close(o.loopDone)
	slots := make(chan struct{}, o.cfg.Concurrency)
	iter := o.currentIter()
	for {
		msg, err := iter.Next()
		if err != nil {
			if o.stopping.Load() {
				return
			}
			o.log.Warn("pull dues failed; trying again", slog.Any("error", err))
			select {
			case <-time.After(pullBackoff):
			case <-o.stopCh:
				return
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				if next, err := o.openIter(context.Background()); err == nil {
					if o.stopping.Load() { // Stop may have drained the old one only
						next.Stop()
						return
					}
					iter = next
				} else {
					o.log.Warn("cannot consume dues again; trying at the next pull", slog.Any("error", err))
				}
			}
			continue
		}
		slots <- struct{}{}
		o.inflight.Add(1)
		go func() {
			defer func() { <-slots; o.inflight.Done() }()
			o.due(msg)
		}()
	}
}

// openIter creates or updates the due consumer and starts pulling from it.
func (o *Owner) openIter(ctx context.Context) (jetstream.MessagesContext, error) {
	cons, err := o.cfg.JS.CreateOrUpdateConsumer(ctx, contract.StreamRetries, jetstream.ConsumerConfig{
		Durable:       ConsumerName(o.cfg.Kind),
		Description:   "retryd owner runtime: runs retry." + o.cfg.Kind + ".due.<id>",
		FilterSubject: contract.RetryFilter(o.cfg.Kind, contract.Due),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       o.cfg.AckWait,
		MaxAckPending: max(o.cfg.Concurrency, 64),
		// Never drop a due: a poison item fails and goes through the
		// retry policy instead.
		MaxDeliver: -1,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", ConsumerName(o.cfg.Kind), err)
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(o.cfg.Concurrency))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", ConsumerName(o.cfg.Kind), err)
	}
	o.mu.Lock()
	o.iter = iter
	o.mu.Unlock()
	return iter, nil
}

func (o *Owner) currentIter() jetstream.MessagesContext {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.iter
}

// due runs the attempt a due event asks for, reports it, then acks.
func (o *Owner) due(msg jetstream.Msg) {
	ev, err := contract.DecodeLifecycle(msg.Subject(), msg.Data())
	if err == nil && (ev.Due == nil || ev.Kind != o.cfg.Kind) {
		err = fmt.Errorf("%w: %s is not a due event of kind %s", contract.ErrInvalid, msg.Subject(), o.cfg.Kind)
	}
	if err != nil {
		// It would fail the same way every time: terminate it, say why.
		o.m.malformed.WithLabelValues(o.cfg.Kind).Inc()
		o.log.Warn("due event does not decode; terminated", slog.String("subject", msg.Subject()), slog.String("reason", contract.LogReason(err)))
		_ = msg.TermWithReason(contract.LogReason(err))
		return
	}
	stop := o.keepInProgress(msg)
	err = o.Run(o.hardCtx, ItemFromDue(ev.Due))
	stop()
	if err != nil {
		// The fact is not stored: the due comes back and runs again.
		o.log.Warn("report attempt failed; due redelivered", slog.String("id", ev.ID), slog.Any("error", err))
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if err := msg.Ack(); err != nil {
		// A redelivered due runs again; its fact has the same Nats-Msg-Id.
		o.log.Debug("ack of due failed", slog.String("id", ev.ID), slog.Any("error", err))
	}
}

// keepInProgress tells the broker every AckWait/3 that msg is still being
// worked on, until the returned func is called.
func (o *Owner) keepInProgress(msg jetstream.Msg) func() {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(o.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = msg.InProgress()
			case <-done:
				return
			}
		}
	}()
	return func() { close(done) }
}

// Run runs one attempt of it with the handler and reports its fact; it
// returns once the fact is stored on RETRIES, or with the error that kept
// it from being stored, and the caller then hands its message back to be
// delivered again. A program calls Run for an item's first attempt, from
// its own stream, and acks its message when Run returns nil: from then on
// the item's retries are retryd's. Start must have been called.
func (o *Owner) Run(ctx context.Context, it *Item) error {
	o.mu.Lock()
	rep := o.reporter
	o.mu.Unlock()
	if rep == nil {
		return errors.New("run item: the owner is not started")
	}
	if it.Kind == "" {
		it.Kind = o.cfg.Kind
	}
	if it.Kind != o.cfg.Kind {
		return fmt.Errorf("run item: %w: kind %q, owner of %q", contract.ErrInvalid, it.Kind, o.cfg.Kind)
	}
	if err := contract.ValidateID("id", it.ID); err != nil {
		return fmt.Errorf("run item: %w", err)
	}
	if it.Attempt < 1 {
		return fmt.Errorf("run item: %w: attempt must be at least 1, got %d", contract.ErrInvalid, it.Attempt)
	}
	if it.started == nil {
		it.started = it.Checkpoint
	}
	start := time.Now()
	hErr := o.call(ctx, it)
	outcome, ev := "succeeded", contract.Succeeded
	var msg *nats.Msg
	var msgErr error
	h, isHold := AsHold(hErr)
	switch {
	case hErr == nil:
		msg, msgErr = o.facts.Succeeded(it)
	case isHold && h.Validate() == nil:
		outcome, ev = "held", contract.Held
		msg, msgErr = o.facts.Held(it, h)
	default:
		outcome, ev = "failed", contract.Failed
		if _, ok := errors.AsType[*panicError](hErr); ok {
			outcome = "panicked"
		}
		f := Classify(hErr, o.cfg.Classifier)
		o.log.Info("attempt failed", slog.String("id", it.ID), slog.Int("attempt", it.Attempt), slog.String("class", string(f.Class)))
		msg, msgErr = o.facts.Failed(it, f)
	}
	o.m.attempts.WithLabelValues(o.cfg.Kind, outcome).Inc()
	o.m.duration.WithLabelValues(o.cfg.Kind, outcome).Observe(time.Since(start).Seconds())
	if msgErr != nil {
		return fmt.Errorf("run item: build %s fact: %w", ev, msgErr)
	}
	if _, err := rep.Report(ctx, it.ID, it.Attempt, ev, msg); err != nil {
		return fmt.Errorf("run item: %w", err)
	}
	return nil
}

// call runs the handler with the attempt's timeout, turning a panic into
// an error of class temporary.
func (o *Owner) call(ctx context.Context, it *Item) (err error) {
	timeout := o.cfg.Timeout
	if it.TimeoutMS > 0 {
		timeout = time.Duration(it.TimeoutMS) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = errclass.Wrap(errclass.Temporary, &panicError{value: r})
		}
	}()
	return o.cfg.Handler(ctx, it)
}

type panicError struct{ value any }

func (p *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", p.value) }

// Stop stops taking dues, waits for running attempts to report, and
// returns. If ctx ends first, running handlers are cancelled and their
// dues are handed back without a fact, to run again; Stop then returns
// ctx's error. Stop is idempotent.
func (o *Owner) Stop(ctx context.Context) error {
	o.stopOnce.Do(func() {
		o.stopping.Store(true)
		close(o.stopCh)
		o.mu.Lock()
		iter, rep := o.iter, o.reporter
		o.started = true // no Start after Stop
		o.mu.Unlock()
		if iter != nil {
			iter.Drain()
			<-o.loopDone
		}
		done := make(chan struct{})
		go func() { o.inflight.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			o.hardCancel()
			// Cancelled attempts nak their dues as soon as they return;
			// a handler that ignores its context is not waited for long.
			select {
			case <-done:
			case <-time.After(stopGrace):
			}
			o.stopErr = fmt.Errorf("stop owner: running attempts interrupted: %w", ctx.Err())
		}
		o.hardCancel()
		if rep != nil {
			if n := rep.Close(); n > 0 {
				o.log.Warn("owner stopped with facts the scheduler has not decided; no longer kept", slog.Int("pending", n))
			}
		}
		o.log.Info("owner stopped")
	})
	return o.stopErr
}
