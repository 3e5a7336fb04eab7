package durable

import (
	"sync"
	"time"
)

// inHand is every message of a batch consumer handed over (queued or in a
// batch) and not settled yet, with when it last got an in-progress ack or
// arrived. Messages still in the client's pull buffer are not here yet:
// during a stall longer than the ack wait they can come back, and the
// handler's idempotence (the inbox) makes each copy a duplicate.
type inHand struct {
	mu   sync.Mutex
	msgs map[*batchMsg]time.Time
}

func newInHand() *inHand { return &inHand{msgs: map[*batchMsg]time.Time{}} }

func (h *inHand) add(m *batchMsg) {
	h.mu.Lock()
	h.msgs[m] = time.Now()
	h.mu.Unlock()
}

// done forgets m, whether it was acked, handed back or left for
// redelivery.
func (h *inHand) done(m *batchMsg) {
	h.mu.Lock()
	delete(h.msgs, m)
	h.mu.Unlock()
}

// stale returns the messages here since before cutoff and restarts their
// clock.
func (h *inHand) stale(cutoff, now time.Time) []*batchMsg {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*batchMsg
	for m, at := range h.msgs {
		if at.Before(cutoff) {
			out = append(out, m)
			h.msgs[m] = now
		}
	}
	return out
}
