package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
)

// BandConsumerName is the durable consumer of one priority band of a job
// type: "worker-<job_type>" for the normal band (the consumer every
// worker had before priorities), "worker-<job_type>=high" and
// "worker-<job_type>=low" for the others. Job types are [a-z0-9_-], so a
// band's name never equals another type's.
func BandConsumerName(jobType string, p contract.Priority) string {
	switch p.Band() {
	case contract.PriorityHigh, contract.PriorityLow:
		return ConsumerName(jobType) + "=" + string(p)
	}
	return ConsumerName(jobType)
}

// band is one priority band's consumer of a job type.
type band struct {
	priority contract.Priority
	p        *pull
	// dispatch runs one of this band's jobs in a slot.
	dispatch func(jetstream.Msg)
	// waiting is set while an idle wait (a pull for one job that waits
	// for it) is out on this band's consumer.
	waiting atomic.Bool
}

// idleGate hands the first job an idle wait brings to the loop, while the
// loop waits for one; any other is handed back to the broker (nak) to be
// fetched again in band order.
type idleGate struct {
	mu    sync.Mutex
	idle  bool
	taken bool
	// arrivals holds the job handed over (one at most per idle wait).
	arrivals chan arrival
	// rearm is signalled when an idle wait ended without a job.
	rearm chan struct{}
}

type arrival struct {
	b   *band
	msg jetstream.Msg
}

// offer hands msg to the loop if it is waiting for a job and has none yet.
func (g *idleGate) offer(b *band, msg jetstream.Msg) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.idle || g.taken {
		return false
	}
	g.taken = true
	g.arrivals <- arrival{b: b, msg: msg} // buffered: never blocks
	return true
}

func (g *idleGate) setIdle(idle bool) {
	g.mu.Lock()
	g.idle, g.taken = idle, false
	g.mu.Unlock()
}

// consumeBands runs the jobs of one type from its band consumers, highest
// band first, never more than Concurrency at a time.
//
// Whenever slots are free, the loop pulls without waiting (no_wait) from
// the high band, then from normal for the slots left, then from low: a
// job of a lower band starts only when no higher job is waiting at that
// moment. The order is the broker's: the loop keeps no job of its own
// beyond those it runs. When every band is empty it keeps one slot and
// puts a pull for one job on each band (an idle wait) and runs the first
// job that comes; a job an idle wait brings while every slot is busy is
// handed back (nak), to be pulled again in band order. So at most one job
// per band is ever delivered ahead of its turn, and it goes straight back.
func (w *Worker) consumeBands(bands []*band, slots chan struct{}) {
	defer w.loops.Done()
	gate := &idleGate{arrivals: make(chan arrival, len(bands)), rearm: make(chan struct{}, len(bands))}
	for {
		free := w.claimSlots(slots)
		if free == 0 {
			return
		}
		got := 0
		for _, b := range bands {
			if free == 0 {
				break
			}
			n := w.sweepBand(b, free, slots)
			got += n
			free -= n
		}
		if got > 0 {
			for range free {
				<-slots
			}
			continue
		}
		// Every band is empty: keep one slot for the first job to come.
		for range free - 1 {
			<-slots
		}
		if !w.idleWait(bands, gate, slots) {
			return
		}
	}
}

// sweepBand pulls up to free jobs of b without waiting and dispatches
// them; it returns how many it got. Each one takes a slot the caller
// holds.
func (w *Worker) sweepBand(b *band, free int, slots chan struct{}) int {
	batch, err := b.p.consumer().FetchNoWait(free)
	got := 0
	if err == nil {
		got, err = w.dispatchBatch(batch, slots, b.dispatch)
	}
	// No pause here: when no band had a job the loop's idle wait follows,
	// and a failed pull there pauses (waitBand).
	w.pullFailed(b.p, err)
	return got
}

// idleWait waits, holding one slot, for the first job of any band and
// dispatches it in that slot. It returns false when the worker stops (the
// slot is released).
func (w *Worker) idleWait(bands []*band, gate *idleGate, slots chan struct{}) bool {
	gate.setIdle(true)
	defer func() {
		gate.setIdle(false)
		// A job handed over as the wait ended goes back to the broker.
		for {
			select {
			case a := <-gate.arrivals:
				_ = a.msg.Nak()
			default:
				return
			}
		}
	}()
	for {
		for _, b := range bands {
			if b.waiting.CompareAndSwap(false, true) {
				w.loops.Add(1)
				go w.waitBand(b, gate)
			}
		}
		select {
		case a := <-gate.arrivals:
			if w.loopCtx.Err() != nil {
				_ = a.msg.Nak()
				<-slots
				return false
			}
			a.b.dispatch(a.msg)
			return true
		case <-gate.rearm:
			// A wait ended empty: put it out again.
		case <-w.loopCtx.Done():
			<-slots
			return false
		}
	}
}

// waitBand is one idle wait: a pull for one job of b that waits up to
// FetchWait. The job is handed to the loop if it still waits for one,
// and back to the broker otherwise.
func (w *Worker) waitBand(b *band, gate *idleGate) {
	defer w.loops.Done()
	fctx, cancel := context.WithTimeout(w.loopCtx, w.cfg.FetchWait)
	defer cancel()
	batch, err := b.p.consumer().Fetch(1, jetstream.FetchContext(fctx))
	var msg jetstream.Msg
	if err == nil {
		for m := range batch.Messages() {
			msg = m
		}
		err = batch.Error()
	}
	if w.pullFailed(b.p, err) {
		select {
		case <-time.After(fetchBackoff):
		case <-w.loopCtx.Done():
		}
	}
	b.waiting.Store(false)
	if msg != nil && gate.offer(b, msg) {
		return
	}
	if msg != nil {
		// The loop has its job, or every slot is busy: this one goes back
		// and is pulled again in its band's turn.
		_ = msg.Nak()
	}
	select {
	case gate.rearm <- struct{}{}:
	default:
	}
}
