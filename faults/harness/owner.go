package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// Outcome is what an Owner reports for a due attempt.
type Outcome struct {
	Fail       bool
	Class      string
	RetryAfter *contract.RetryAfter
}

// Effect is what an Owner recorded for one (kind, id, attempt).
type Effect struct {
	Kind, ID string
	Attempt  int
	// Seqs are the distinct RETRIES sequences the due arrived as: more
	// than one means the due was stored twice, an effect a consumer
	// without an inbox would apply twice.
	Seqs map[uint64]bool
	// Deliveries counts every delivery, redeliveries of one message
	// included (absorbed by the owner's ack and Nats-Msg-Id).
	Deliveries    int
	FirstArrival  time.Time
	NextAttemptAt time.Time
	Published     time.Time
}

// Owner plays the owner of a retry kind the suite invents (e.g. "ft"),
// as ingress and triggers own theirs: it consumes retry.<kind>.due.*
// through a durable consumer, records each due as an effect, publishes
// the outcome Decide chooses (with its PubAck) and only then acks.
type Owner struct {
	sys    *System
	Kind   string
	Decide func(d contract.DueData) Outcome

	mu      sync.Mutex
	effects map[string]*Effect
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewOwner returns an owner of kind that succeeds every due unless decide
// says otherwise (decide may be nil).
func (s *System) NewOwner(kind string, decide func(contract.DueData) Outcome) *Owner {
	if decide == nil {
		decide = func(contract.DueData) Outcome { return Outcome{} }
	}
	return &Owner{sys: s, Kind: kind, Decide: decide, effects: map[string]*Effect{}}
}

// Durable is the owner's consumer name.
func (o *Owner) Durable() string { return "faults-owner-" + o.Kind }

// Start consumes until Stop. A supervisor recreates the consumer when it
// or its stream was deleted.
func (o *Owner) Start() {
	ctx, cancel := context.WithCancel(o.sys.Ctx)
	o.cancel, o.done = cancel, make(chan struct{})
	work := make(chan jetstream.Msg, 256)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				o.handle(ctx, m)
			}
		}()
	}
	go func() {
		defer close(o.done)
		defer func() { close(work); wg.Wait() }()
		var cc jetstream.ConsumeContext
		for {
			if cc == nil || !o.consumerExists(ctx) {
				if cc != nil {
					cc.Stop()
				}
				cc = o.consume(ctx, work)
			}
			select {
			case <-ctx.Done():
				if cc != nil {
					cc.Stop()
				}
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	o.sys.T.Cleanup(o.Stop)
}

// Stop stops consuming.
func (o *Owner) Stop() {
	if o.cancel != nil {
		o.cancel()
		<-o.done
	}
}

func (o *Owner) consumerExists(ctx context.Context) bool {
	c, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := o.sys.JS.Consumer(c, contract.StreamRetries, o.Durable())
	return !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound)
}

func (o *Owner) consume(ctx context.Context, work chan<- jetstream.Msg) jetstream.ConsumeContext {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := o.sys.JS.CreateOrUpdateConsumer(c, contract.StreamRetries, jetstream.ConsumerConfig{
		Durable:       o.Durable(),
		FilterSubject: contract.RetryFilter(o.Kind, contract.Due),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       5 * time.Second,
		MaxAckPending: 4000,
		MaxDeliver:    -1,
	})
	if err != nil {
		return nil
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(500))
	if err != nil {
		return nil
	}
	return cc
}

func (o *Owner) handle(ctx context.Context, m jetstream.Msg) {
	ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
	if err != nil || ev.Due == nil {
		_ = m.Term()
		return
	}
	d := ev.Due
	md, _ := m.Metadata()
	key := fmt.Sprintf("%s/%s/%d", d.Kind, d.ID, d.Attempt)
	o.mu.Lock()
	e := o.effects[key]
	if e == nil {
		e = &Effect{Kind: d.Kind, ID: d.ID, Attempt: d.Attempt, Seqs: map[uint64]bool{}, FirstArrival: time.Now(),
			NextAttemptAt: d.NextAttemptAt, Published: ev.Envelope.Time}
		o.effects[key] = e
	}
	e.Deliveries++
	if md != nil {
		e.Seqs[md.Sequence.Stream] = true
	}
	o.mu.Unlock()

	out := o.Decide(*d)
	var msg *nats.Msg
	if out.Fail {
		msg, err = contract.NewLifecycleMsg("faults/owner", contract.Failed, &contract.FailedData{
			Kind: d.Kind, ID: d.ID, Attempt: d.Attempt, RetryAfter: out.RetryAfter,
			Error: contract.ErrorInfo{Class: out.Class, Message: "fault suite: attempt failed"},
		}, time.Now())
	} else {
		msg, err = contract.NewLifecycleMsg("faults/owner", contract.Succeeded, &contract.SucceededData{
			Kind: d.Kind, ID: d.ID, Attempt: d.Attempt,
		}, time.Now())
	}
	if err != nil {
		o.sys.T.Errorf("owner: build outcome: %v", err)
		return
	}
	if err := PublishRetrying(ctx, o.sys.JS, msg); err != nil {
		return // stopping; the due comes back
	}
	_ = m.Ack()
}

// Effects returns a copy of the recorded effects.
func (o *Owner) Effects() map[string]Effect {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]Effect, len(o.effects))
	for k, e := range o.effects {
		c := *e
		c.Seqs = make(map[uint64]bool, len(e.Seqs))
		for s := range e.Seqs {
			c.Seqs[s] = true
		}
		out[k] = c
	}
	return out
}

// Count is the number of distinct (kind, id, attempt) dues received.
func (o *Owner) Count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.effects)
}

// Has reports whether the due of (id, attempt) arrived.
func (o *Owner) Has(id string, attempt int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.effects[fmt.Sprintf("%s/%s/%d", o.Kind, id, attempt)]
	return ok
}

// Tally sums the effects: duplicate effects (stored copies beyond the
// first) and redeliveries (deliveries beyond the distinct copies).
func (o *Owner) Tally() (dups, redeliveries int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.effects {
		if len(e.Seqs) > 1 {
			dups += len(e.Seqs) - 1
		}
		if e.Deliveries > len(e.Seqs) {
			redeliveries += e.Deliveries - len(e.Seqs)
		}
	}
	return dups, redeliveries
}

// PublishRetrying publishes msg to JetStream until it is acknowledged (a
// duplicate counts) or ctx ends, across NATS restarts.
func PublishRetrying(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) error {
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.PublishMsg(c, msg)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
