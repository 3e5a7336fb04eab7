package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// asyncPublisher publishes to JetStream without waiting for each PubAck
// and calls a callback when the ack (or an error) arrives, in publish
// order. It is how every owner in the bench publishes: one round trip per
// message would measure the loopback, not the system.
type asyncPublisher struct {
	js      jetstream.JetStream
	pending chan pendingPub
	done    chan struct{}
	errs    atomic.Int64
	lastErr atomic.Value // error
	// outstanding counts publishes whose ack has not been handled yet.
	outstanding atomic.Int64
	// mu lets close wait for publishes in progress; closed refuses new
	// ones (consumer callbacks may still publish while a run shuts down).
	mu     sync.RWMutex
	closed bool
}

var errPublisherClosed = errors.New("publisher closed")

type pendingPub struct {
	fut jetstream.PubAckFuture
	cb  func(error)
}

func newAsyncPublisher(js jetstream.JetStream) *asyncPublisher {
	p := &asyncPublisher{js: js, pending: make(chan pendingPub, 65536), done: make(chan struct{})}
	go p.wait()
	return p
}

func (p *asyncPublisher) wait() {
	defer close(p.done)
	for pp := range p.pending {
		var err error
		select {
		case <-pp.fut.Ok():
		case err = <-pp.fut.Err():
		}
		if err != nil {
			p.errs.Add(1)
			p.lastErr.Store(err)
		}
		if pp.cb != nil {
			pp.cb(err)
		}
		p.outstanding.Add(-1)
	}
}

// publish sends msg; cb (may be nil) runs once the PubAck or error
// arrives. A full async window makes it wait, which is the back pressure
// a real producer gets.
func (p *asyncPublisher) publish(ctx context.Context, msg *nats.Msg, cb func(error)) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errPublisherClosed
	}
	for {
		fut, err := p.js.PublishMsgAsync(msg)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("publish %s: %w", msg.Subject, err)
		}
		p.outstanding.Add(1)
		p.pending <- pendingPub{fut: fut, cb: cb}
		return nil
	}
}

// flush waits until every publish so far has its ack handled.
func (p *asyncPublisher) flush(ctx context.Context, timeout time.Duration) bool {
	return waitFor(ctx, timeout, func() bool { return p.outstanding.Load() == 0 })
}

// close waits for the outstanding acks.
func (p *asyncPublisher) close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.pending)
	}
	p.mu.Unlock()
	<-p.done
}

func (p *asyncPublisher) errors() (int64, error) {
	err, _ := p.lastErr.Load().(error)
	return p.errs.Load(), err
}

// consume runs handle for every message of a durable pull consumer until
// the returned stop is called. handle acks (or naks) itself.
func consume(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, handle func(jetstream.Msg)) (stop func(), err error) {
	if cfg.AckPolicy == jetstream.AckNonePolicy {
		cfg.AckPolicy = jetstream.AckExplicitPolicy
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 30 * time.Second
	}
	c, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", cfg.Durable, err)
	}
	cc, err := c.Consume(handle, jetstream.PullMaxMessages(1000), jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", cfg.Durable, err)
	}
	var once sync.Once
	return func() { once.Do(cc.Stop) }, nil
}

// waitFor polls cond every 10 ms until it holds, ctx ends or timeout
// passes; it reports whether cond held.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pace calls fn(n) every tick with the number of items due so far at
// rate per second, until ctx ends or dur passes; it keeps the rate
// whatever fn costs (a late tick sends more).
func pace(ctx context.Context, rate int, dur time.Duration, fn func(n int) error) (sent int, err error) {
	const tick = 5 * time.Millisecond
	start := time.Now()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		el := time.Since(start)
		if el >= dur {
			return sent, nil
		}
		want := int(float64(rate) * el.Seconds())
		if want > sent {
			if err := fn(want - sent); err != nil {
				return sent, err
			}
			sent = want
		}
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-t.C:
		}
	}
}
