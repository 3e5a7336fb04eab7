package scheduler

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// inHand is every message this instance was handed and has not finished
// with. The ack wait is short so that the messages of a killed instance go
// to another one within seconds; the messages still here are kept from
// being redelivered meanwhile by an in-progress ack, sent once they have
// been here a quarter of the ack wait (a batch waiting on a lock, a slow
// database). A healthy stage acks within milliseconds, so most messages
// never need one. Messages still in the client's pull buffer are not here
// yet: during a stall longer than the ack wait they can come back, and the
// inbox makes each copy a duplicate.
type inHand struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]time.Time
}

func newInHand() *inHand { return &inHand{msgs: map[jetstream.Msg]time.Time{}} }

func (h *inHand) add(m jetstream.Msg) {
	h.mu.Lock()
	h.msgs[m] = time.Now()
	h.mu.Unlock()
}

// done forgets msgs, whether they were acked, handed back or left for
// redelivery.
func (h *inHand) done(msgs []jetstream.Msg) {
	h.mu.Lock()
	for _, m := range msgs {
		delete(h.msgs, m)
	}
	h.mu.Unlock()
}

// stale returns the messages here since before cutoff and restarts their
// clock.
func (h *inHand) stale(cutoff, now time.Time) []jetstream.Msg {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []jetstream.Msg
	for m, at := range h.msgs {
		if at.Before(cutoff) {
			out = append(out, m)
			h.msgs[m] = now
		}
	}
	return out
}

// runProgressLoop sends the in-progress acks of inHand every quarter of
// the ack wait, for each message here for at least that long. The server's
// clock of a message started when it reached the client's pull buffer, a
// little before it was handed over here, so a message gets its first
// in-progress ack at most half the ack wait after it was handed over.
func (s *Scheduler) runProgressLoop(ctx context.Context) {
	every := s.cfg.AckWait / 4
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		for _, m := range s.inHand.stale(now.Add(-every), now) {
			// An ack that raced this one wins; the error says only that.
			if err := m.InProgress(); err == nil {
				s.metrics.inProgress.Inc()
			}
		}
	}
}
