package owner

import (
	"container/list"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/retryd/retryd/pkg/contract"
)

// decisionBuffer is how many lifecycle messages of pending items wait for
// the goroutine that matches them. Past it the client drops them (a slow
// consumer); the republish loop finds a dropped decision on the stream.
const decisionBuffer = 8192

// pendingFact is a failed or held fact this owner published and the
// scheduler has not decided yet: what it takes to publish it again.
type pendingFact struct {
	id      string
	attempt int
	event   contract.Lifecycle
	subject string
	header  nats.Header
	data    []byte
	msgID   string
	// seq is the stream sequence of the stored copy; acked is false until
	// the first PubAck, and nothing is checked or republished before it.
	seq   uint64
	acked bool
	// decided is set when the decision overtakes the PubAck.
	decided bool
	// nextCheck is when the republish loop looks at the fact next.
	nextCheck time.Time
	// sub delivers every lifecycle message of the item; one per item, so a
	// later attempt's fact takes over the earlier one's subscription.
	sub  *nats.Subscription
	elem *list.Element
}

// pendingSet is the facts waiting for their decision, oldest first. A
// purge of RETRIES removes a fact the scheduler had not read; the owner
// keeps its own copy until the decision shows that it was read.
type pendingSet struct {
	nc        *nats.Conn
	kind      string
	limit     int
	wait      time.Duration
	now       func() time.Time
	log       *slog.Logger
	m         *ReporterMetrics
	decisions chan *nats.Msg
	done      chan struct{}

	mu     sync.Mutex
	byID   map[string]*pendingFact
	order  *list.List
	closed bool
}

func newPendingSet(nc *nats.Conn, kind string, limit int, wait time.Duration, now func() time.Time, log *slog.Logger, m *ReporterMetrics) *pendingSet {
	p := &pendingSet{
		nc: nc, kind: kind, limit: limit, wait: wait, now: now, log: log, m: m,
		decisions: make(chan *nats.Msg, decisionBuffer),
		done:      make(chan struct{}),
		byID:      map[string]*pendingFact{},
		order:     list.New(),
	}
	go p.matchDecisions()
	return p
}

// track makes room for the fact of attempt of item id before it is
// published: the subscription to the item's lifecycle must exist before
// the scheduler can read the fact, or its decision could go unseen. It
// returns nil when the fact is not kept: the set is closed, an earlier
// attempt is reported after a later one (a stale redelivery: its decision
// is moot), or the subscription failed.
func (p *pendingSet) track(id string, attempt int, ev contract.Lifecycle) *pendingFact {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	old := p.byID[id]
	switch {
	case old != nil && old.attempt > attempt:
		return nil
	case old != nil && old.attempt == attempt:
		// A redelivered attempt reports the same fact again.
		return old
	}
	f := &pendingFact{id: id, attempt: attempt, event: ev}
	if old != nil {
		// A later attempt ran: the earlier fact was decided, even if its
		// decision went unseen.
		f.sub = old.sub
		p.order.Remove(old.elem)
	} else {
		if p.order.Len() >= p.limit {
			p.evictOldest()
		}
		sub, err := p.nc.ChanSubscribe(contract.RetryItemFilter(p.kind, id), p.decisions)
		if err != nil {
			p.log.Warn("cannot follow the decision of a failure; it is published without a copy kept", slog.String("id", id), slog.Int("attempt", attempt), slog.Any("error", err))
			return nil
		}
		f.sub = sub
		// Inc and Dec, not Set: owners sharing a registry share the gauge.
		p.m.Pending.Inc()
	}
	f.elem = p.order.PushBack(f)
	p.byID[id] = f
	return f
}

// evictOldest drops the oldest fact to keep the set within its limit. The
// oldest is the one most likely decided already with its decision unseen;
// if not, a purge before the scheduler reads it loses it, as it would
// without the set.
func (p *pendingSet) evictOldest() {
	f := p.order.Front().Value.(*pendingFact)
	p.removeLocked(f)
	p.m.Evicted.Inc()
	p.log.Warn("pending facts at Config.PendingLimit; the oldest is no longer kept", slog.String("id", f.id), slog.Int("attempt", f.attempt), slog.Int("limit", p.limit))
}

// published records the PubAck of f's fact: msg is what was published and
// seq where the stream stored it.
func (p *pendingSet) published(f *pendingFact, msg *nats.Msg, seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID[f.id] != f {
		return
	}
	if f.decided {
		p.removeLocked(f)
		return
	}
	f.subject, f.data, f.seq, f.acked = msg.Subject, msg.Data, seq, true
	f.header = make(nats.Header, len(msg.Header))
	for k, v := range msg.Header {
		f.header[k] = append([]string(nil), v...)
	}
	f.msgID = msg.Header.Get(contract.HeaderMsgID)
	f.nextCheck = p.now().Add(p.wait)
}

// abandon forgets f after its publish failed: the item's message goes
// back to the broker and its next delivery reports again. A fact stored by an earlier
// delivery stays.
func (p *pendingSet) abandon(f *pendingFact) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID[f.id] == f && !f.acked {
		p.removeLocked(f)
	}
}

// removeLocked forgets f and ends its subscription.
func (p *pendingSet) removeLocked(f *pendingFact) {
	delete(p.byID, f.id)
	p.order.Remove(f.elem)
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
	}
	p.m.Pending.Dec()
}

// decides reports whether a lifecycle event of an item at attempt a shows
// that the scheduler read the item's fact of attempt n, or never will
// decide it: the decision (scheduled or rescheduled n+1, exhausted n), a
// cancel (the scheduler then finds the fact stale), or anything about a
// later attempt. live is set for an event published after the fact: a
// cancel then ends the item whatever attempt it names (0 for an item the
// scheduler had no row for).
func decides(ev contract.Lifecycle, a, n int, live bool) bool {
	switch ev {
	case contract.Released:
		return false // its id is a hold key
	case contract.Cancelled:
		return live || a >= n
	case contract.Exhausted:
		return a >= n
	}
	return a > n
}

// matchDecisions reads the items' lifecycle messages until the set closes.
// A message that does not decode is ignored: it decides nothing.
func (p *pendingSet) matchDecisions() {
	for {
		select {
		case msg := <-p.decisions:
			ev, err := contract.DecodeLifecycle(msg.Subject, msg.Data)
			if err != nil {
				p.log.Debug("ignoring a lifecycle message that does not decode", slog.String("subject", msg.Subject), slog.String("reason", contract.LogReason(err)))
				continue
			}
			p.decided(ev.ID, ev.Event, ev.Attempt())
		case <-p.done:
			return
		}
	}
}

// decided drops the fact of item id if event ev at attempt a decides it.
func (p *pendingSet) decided(id string, ev contract.Lifecycle, a int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.byID[id]
	if f == nil || !decides(ev, a, f.attempt, true) {
		return
	}
	if !f.acked {
		f.decided = true
		return
	}
	p.removeLocked(f)
}

// due returns copies of the facts whose check is due at now, oldest first.
func (p *pendingSet) due(now time.Time) []pendingFact {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []pendingFact
	for e := p.order.Front(); e != nil; e = e.Next() {
		f := e.Value.(*pendingFact)
		if f.acked && !f.decided && !now.Before(f.nextCheck) {
			out = append(out, *f)
		}
	}
	return out
}

// checked records the outcome of a check of the fact c copies, unless it
// changed meanwhile: decided drops it; otherwise seq is where its copy is
// stored now and the next check is one wait later.
func (p *pendingSet) checked(c pendingFact, decided bool, seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.byID[c.id]
	if f == nil || f.attempt != c.attempt || !f.acked {
		return
	}
	if decided {
		p.removeLocked(f)
		return
	}
	f.seq = seq
	f.nextCheck = p.now().Add(p.wait)
}

// close ends every subscription and the matching, and returns how many
// facts were still waiting. Later facts are not kept.
func (p *pendingSet) close() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0
	}
	p.closed = true
	n := p.order.Len()
	for p.order.Len() > 0 {
		p.removeLocked(p.order.Front().Value.(*pendingFact))
	}
	close(p.done)
	return n
}
