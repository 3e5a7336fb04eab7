package durable

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// BatchHandler handles a batch of messages, in stream order. It settles
// each message it decides about with the message's own methods (Ack,
// NakWithDelay, TermWithReason...); its error then settles every message
// it left, as a Handler's error settles its one message (nil acks them,
// one wrapping ErrAbandon leaves them for redelivery: return what
// failpoint.Func.At returned). ctx ends only when Drain gives up waiting.
type BatchHandler func(ctx context.Context, msgs []jetstream.Msg) error

// Pauses after a batch whose handler failed (an error that hands its
// messages back as a failure): the next batch would likely fail the same
// way (the database is away), and its messages are better left to
// JetStream's redelivery than spun through the handler. The pause doubles
// while batches keep failing.
const (
	minFailPause = 100 * time.Millisecond
	maxFailPause = 5 * time.Second
)

// batchMsg is a message handed over in a batch. Settling it through its
// own methods tells the runtime, which then stops its in-progress acks and
// does not settle it again. A failed ack still counts as settled: the
// message comes back and the handler finds it applied.
type batchMsg struct {
	jetstream.Msg
	hand  *inHand
	owner *batchOwner
	done  atomic.Bool
}

// batchOwner is what Settle needs of the consumer a batch message came
// from.
type batchOwner struct {
	g        *Group
	consumer string
	log      zerolog.Logger
}

// Settle settles m, a message a BatchHandler was handed, as a Handler's
// err settles its message (see the package doc): nil acks it, NakAfter
// hands it back for later, Reject or a malformed error terminates it
// (counting the malformed), ErrAbandon leaves it in hand for the batch's
// error to leave, anything else hands it back as a failure. A handler
// that decides message by message uses it to settle each one by the rules
// a Handler's messages follow. It reports false, and does nothing, when m
// is not a batch message.
func Settle(m jetstream.Msg, err error) bool {
	bm, ok := m.(*batchMsg)
	if !ok || bm.owner == nil {
		return false
	}
	if !errors.Is(err, ErrAbandon) {
		bm.owner.g.settle(bm.owner.consumer, bm.owner.log, bm, err)
	}
	return true
}

// forget marks m finished with; it reports whether it was not already.
func (m *batchMsg) forget() bool {
	if !m.done.CompareAndSwap(false, true) {
		return false
	}
	m.hand.done(m)
	return true
}

func (m *batchMsg) Ack() error { m.forget(); return m.Msg.Ack() }

func (m *batchMsg) DoubleAck(ctx context.Context) error { m.forget(); return m.Msg.DoubleAck(ctx) }

func (m *batchMsg) Nak() error { m.forget(); return m.Msg.Nak() }

func (m *batchMsg) NakWithDelay(delay time.Duration) error {
	m.forget()
	return m.Msg.NakWithDelay(delay)
}

func (m *batchMsg) Term() error { m.forget(); return m.Msg.Term() }

func (m *batchMsg) TermWithReason(reason string) error {
	m.forget()
	return m.Msg.TermWithReason(reason)
}

// startBatch starts r's batch workers and its in-progress loop.
func (g *Group) startBatch(r *running) {
	log := g.log.With().Str("consumer", r.spec.Config.Durable).Logger()
	for range r.spec.Workers {
		g.batchers.Add(1)
		go g.runBatches(r, log)
	}
	if r.spec.Progress > 0 {
		g.progress.Add(1)
		go g.runProgress(r)
	}
}

// enqueue is a batch consumer's consume callback: it queues the message
// for a batch worker. The queue holds one batch, so a slow handler holds
// the pull back.
func (g *Group) enqueue(r *running) jetstream.MessageHandler {
	owner := &batchOwner{g: g, consumer: r.spec.Config.Durable,
		log: g.log.With().Str("consumer", r.spec.Config.Durable).Logger()}
	return func(msg jetstream.Msg) {
		m := &batchMsg{Msg: msg, hand: r.hand, owner: owner}
		r.hand.add(m)
		select {
		case r.queue <- m:
		case <-g.abort:
			// Stopped without a drain: delivered again after the ack wait.
			m.forget()
		}
	}
}

// runBatches hands over what is queued (up to Spec.Batch) without waiting
// for more, so a lone message is handled at once and a burst shares a
// batch. Once the consumer is drained it handles what is still queued and
// returns.
func (g *Group) runBatches(r *running, log zerolog.Logger) {
	defer g.batchers.Done()
	var pause time.Duration
	for {
		first, ok := g.next(r)
		if !ok {
			return
		}
		msgs := []jetstream.Msg{first}
	fill:
		for len(msgs) < r.spec.Batch {
			select {
			case m := <-r.queue:
				msgs = append(msgs, m)
			default:
				break fill
			}
		}
		if err := g.handleBatch(r, log, msgs); !transient(err) {
			pause = 0
			continue
		}
		pause = min(max(2*pause, minFailPause), maxFailPause)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-g.abort:
			t.Stop()
		}
	}
}

// next waits for the first message of a batch; false once the consumer
// has been drained and nothing is queued.
func (g *Group) next(r *running) (jetstream.Msg, bool) {
	select {
	case m := <-r.queue:
		return m, true
	case <-g.abort:
		select {
		case m := <-r.queue:
			return m, true
		default:
			return nil, false
		}
	}
}

// handleBatch runs the handler on msgs and settles what it left by its
// error.
func (g *Group) handleBatch(r *running, log zerolog.Logger, msgs []jetstream.Msg) error {
	// The handler gets its own slice: it may sort or filter it.
	err := r.spec.HandleBatch(g.handleCtx, slices.Clone(msgs))
	if errors.Is(err, ErrAbandon) {
		left := 0
		for _, m := range msgs {
			if m.(*batchMsg).forget() {
				left++
			}
		}
		if left > 0 {
			log.Warn().Err(err).Int("messages", left).Msg("batch abandoned unacked")
		}
		return err
	}
	for _, m := range msgs {
		if bm := m.(*batchMsg); !bm.done.Load() {
			g.settle(r.spec.Config.Durable, log, bm, err)
		}
	}
	return err
}

// runProgress sends the in-progress acks of r's messages in hand every
// Spec.Progress, for each message there for at least that long. The
// server's clock of a message started when it reached the client's pull
// buffer, a little before it was handed over, so a message gets its first
// in-progress ack at most twice Spec.Progress after it was handed over.
func (g *Group) runProgress(r *running) {
	defer g.progress.Done()
	every := r.spec.Progress
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-g.handleCtx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		for _, m := range r.hand.stale(now.Add(-every), now) {
			// An ack that raced this one wins; the error says only that.
			if err := m.Msg.InProgress(); err == nil && r.spec.InProgress != nil {
				r.spec.InProgress.Inc()
			}
		}
	}
}
