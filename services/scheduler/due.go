package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
	"github.com/retryd/retryd/stores/retrystore"
)

// publishTimeout bounds the wait for the PubAcks of one batch.
const publishTimeout = 10 * time.Second

// lockedRetry is the pause when due rows exist but are locked elsewhere.
const lockedRetry = 20 * time.Millisecond

// runDueLoop emits due events until ctx is done. It holds one timer: after
// a batch that was not full it sleeps until the earliest next_attempt_at
// (or the next re-emission), at most MaxIdle, and wakes early when this
// process schedules something sooner.
func (s *Scheduler) runDueLoop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := 0
	for {
		s.plannedWake.Store(math.MaxInt64)
		n, err := s.emitDue(ctx, nil)
		if ctx.Err() != nil {
			return
		}
		var sleep time.Duration
		switch {
		case err != nil:
			failures++
			s.metrics.errors.WithLabelValues("due").Inc()
			sleep = min(time.Duration(1<<min(failures, 6))*50*time.Millisecond, max(s.cfg.MaxIdle, time.Second))
			s.log.Warn().Err(err).Dur("retry_in", sleep).Msg("due emission failed")
		case n >= s.cfg.BatchSize:
			failures = 0
			s.drainBurst(ctx) // more are due right now
			continue
		default:
			failures = 0
			sleep, err = s.idleFor(ctx)
			if err != nil {
				sleep = s.cfg.MaxIdle
				s.log.Warn().Err(err).Msg("read next due time")
			}
		}
		if sleep <= 0 {
			if n > 0 {
				continue
			}
			// Due rows exist but another transaction holds them (another
			// instance emitting them): look again shortly instead of spinning.
			sleep = min(s.cfg.MaxIdle, lockedRetry)
		}
		timer.Reset(sleep)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			timer.Stop() // Go 1.23 timers: no stale tick after Stop
		case <-timer.C:
		}
	}
}

// drainBurst emits a backlog of due rows with Config.Emitters concurrent
// emitters until each finds less than a full batch. Each batch waits for
// its PubAcks inside its transaction; overlapping batches keep Postgres and
// JetStream busy while one waits. The goroutines exist only while the
// backlog lasts.
func (s *Scheduler) drainBurst(ctx context.Context) {
	b := &burst{}
	var wg sync.WaitGroup
	for range s.cfg.Emitters {
		wg.Go(func() {
			for ctx.Err() == nil {
				n, err := s.emitDue(ctx, b)
				if err != nil {
					if ctx.Err() == nil {
						s.metrics.errors.WithLabelValues("due").Inc()
						s.log.Warn().Err(err).Msg("due emission failed")
					}
					return
				}
				if n < s.cfg.BatchSize {
					return
				}
			}
		})
	}
	wg.Wait()
	// The loop's next pass claims without a floor: rows the burst passed
	// over (released after a failed publish, or scheduled behind the
	// floor meanwhile) are found there.
}

// burst is what the emitters of one drainBurst share: the floor, below
// which every due row has been handed to a batch. Each emitter takes the
// next range of at most one batch above the floor in turn (a read of the
// due index) and claims it concurrently with the others: no claim steps
// over the rows another holds, and Postgres works on several at once.
//
// The batches are published in the order of their ranges, though (turn):
// a release makes a source's held events due one microsecond apart in
// the order they were first held, and the gate hands out slots in the
// order the dues reach it. Batches published at once would interleave a
// release of more than one batch on RETRIES.
type burst struct {
	mu    sync.Mutex
	floor time.Time
	// last ends when the batch claimed last has been published.
	last chan struct{}
}

// turn orders the publication of one batch of a burst after the batch
// claimed before it. A nil turn (outside a burst) never waits.
type turn struct {
	prev <-chan struct{}
	done chan struct{}
	once sync.Once
}

// wait returns once the previous batch has been published.
func (t *turn) wait(ctx context.Context) error {
	if t == nil || t.prev == nil {
		return nil
	}
	select {
	case <-t.prev:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the previous due batch: %w", ctx.Err())
	}
}

// end lets the next batch publish. A batch that failed still waits for
// the previous one first, so the next never overtakes it.
func (t *turn) end(ctx context.Context) {
	if t == nil {
		return
	}
	t.once.Do(func() {
		_ = t.wait(ctx)
		close(t.done)
	})
}

// next hands out the publication turn of a batch claimed now, under mu.
func (b *burst) next() *turn {
	t := &turn{prev: b.last, done: make(chan struct{})}
	b.last = t.done
	return t
}

// claim claims the next batch of due rows above the floor; the batch
// publishes in turn t.
func (b *burst) claim(ctx context.Context, tx pgx.Tx, limit int) (rows []retrystore.DueRow, t *turn, err error) {
	b.mu.Lock()
	t = b.next()
	rows, err = b.claimLocked(ctx, tx, limit)
	return rows, t, err
}

// claimLocked claims the next batch above the floor; b.mu is held and
// released by it.
func (b *burst) claimLocked(ctx context.Context, tx pgx.Tx, limit int) ([]retrystore.DueRow, error) {
	from := b.floor
	bound, ok, err := retrystore.DueBound(ctx, tx, from, limit)
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if ok && bound.After(from) {
		b.floor = bound
		b.mu.Unlock()
		return retrystore.ClaimDue(ctx, tx, limit, retrystore.Range{From: from, Until: bound})
	}
	// The tail of the backlog, or a batch of rows due at the very same
	// instant: claimed in turn, the floor moving to the last of them.
	defer b.mu.Unlock()
	rows, err := retrystore.ClaimDue(ctx, tx, limit, retrystore.Range{From: from})
	if err != nil || len(rows) == 0 {
		return rows, err
	}
	if last := rows[len(rows)-1].NextAttemptAt; last != nil && last.After(b.floor) {
		b.floor = *last
	}
	return rows, nil
}

// idleFor returns how long the due loop may sleep: until the earliest
// next_attempt_at or re-emission by the database clock, at most MaxIdle.
// It publishes the planned wake-up time for wakeDueLoop.
func (s *Scheduler) idleFor(ctx context.Context) (time.Duration, error) {
	next, ok, dbNow, err := retrystore.NextDue(ctx, s.cfg.Pool)
	if err != nil {
		return 0, err
	}
	sleep := s.cfg.MaxIdle
	if ok {
		sleep = min(sleep, next.Sub(dbNow))
	}
	if redue, ok, err := retrystore.NextRedue(ctx, s.cfg.Pool, s.redueAfter(ctx)); err != nil {
		return 0, err
	} else if ok {
		sleep = min(sleep, redue)
	}
	if sleep > 0 {
		s.plannedWake.Store(dbNow.Add(sleep).UnixNano())
	}
	return sleep, nil
}

// dueItem is one row being emitted.
type dueItem struct {
	row   retrystore.DueRow
	redue bool
	msg   *nats.Msg
	ack   jetstream.PubAckFuture
	ok    bool
	dup   bool
	// buildErr is why the event could not be built: the row is parked.
	buildErr error
	// span is the producer span of the publish, a child of the decision
	// that scheduled the row (Retry.TraceContext).
	span trace.Span
	// late is how late the publish was by the database clock.
	late time.Duration
}

// emitDue publishes one batch of due events (first emissions, then
// re-emissions of due rows nobody resolved). It claims the rows in a
// transaction that marks them due and holds their locks, publishes, waits
// for the PubAcks, puts back the rows whose event was not stored and
// commits. A crash before the commit leaves the rows as they were: they
// are published again with the same Nats-Msg-Id and JetStream drops the
// copy.
//
// b is nil outside a burst; within one, b spaces the claims of the
// emitters.
func (s *Scheduler) emitDue(ctx context.Context, b *burst) (int, error) {
	// Decisions are committed before their rows can be claimed; publishing
	// what the outbox holds first keeps each scheduled event ahead of its
	// due in the stream (best effort: the relay may hold some rows itself,
	// and the rebuild copes either way). It runs before the transaction so
	// an emitter never holds two connections at once: concurrent emitters
	// waiting for a second one could exhaust the pool.
	if _, err := s.relay.Flush(ctx); err != nil {
		s.log.Debug().Err(err).Msg("flush outbox before due")
	}
	// Read before the transaction: it may ask NATS for the consumer's state.
	redueAfter := s.redueAfter(ctx)
	tx, err := s.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	var rows []retrystore.DueRow
	var order *turn
	if b != nil {
		rows, order, err = b.claim(ctx, tx, s.cfg.BatchSize)
		defer order.end(ctx)
	} else {
		rows, err = retrystore.ClaimDue(ctx, tx, s.cfg.BatchSize, retrystore.Range{})
	}
	if err != nil {
		return 0, err
	}
	items := make([]*dueItem, 0, len(rows))
	for _, r := range rows {
		items = append(items, &dueItem{row: r})
	}
	if len(rows) < s.cfg.BatchSize {
		redue, err := retrystore.ClaimRedue(ctx, tx, redueAfter, s.cfg.BatchSize-len(rows))
		if err != nil {
			return 0, err
		}
		for _, r := range redue {
			items = append(items, &dueItem{row: r, redue: true})
		}
	}
	if len(items) == 0 {
		return 0, nil
	}
	// The claim set due_at to the transaction's now(): the time of the
	// emission in the event and in the history.
	now := *items[0].row.DueAt
	if err := order.wait(ctx); err != nil {
		return 0, err
	}
	s.publishDue(ctx, items, now, time.Now(), order)

	history := make([]retrystore.HistoryEntry, 0, len(items))
	var unpublished, unbuildable []retrystore.DueRow
	var reasons []string
	for _, it := range items {
		switch {
		case it.buildErr != nil:
			unbuildable = append(unbuildable, it.row)
			reasons = append(reasons, "due event not built: "+contract.LogReason(it.buildErr))
			continue
		case !it.ok:
			unpublished = append(unpublished, it.row)
			continue
		}
		history = append(history, dueEntry(&it.row.Retry, it.msg.Header.Get(contract.HeaderMsgID), now))
	}
	if err := s.cfg.Failpoint.At(ctx, FailpointDuesPublished); err != nil {
		return 0, err
	}
	if err := retrystore.ReleaseDue(ctx, tx, unpublished); err != nil {
		return 0, err
	}
	// An event that cannot be built now never can: the row is set aside
	// instead of failing every pass, and the loop goes on without backing
	// off (publishDue logged and counted it).
	if err := retrystore.ParkDue(ctx, tx, unbuildable, s.cfg.RedueAfter, reasons); err != nil {
		return 0, err
	}
	if err := retrystore.InsertHistory(ctx, tx, history...); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	s.observeDue(items)
	if len(unpublished) > 0 {
		return len(items), fmt.Errorf("%d of %d due events were not acknowledged", len(unpublished), len(items))
	}
	return len(items), nil
}

// publishDue publishes the batch asynchronously and waits for every
// PubAck; it sets ok (and dup) on the items that were stored.
// selected is when the rows were read: their lateness was measured then.
//
// The next batch of a burst may publish (order ends) once this one is
// handed to the connection, before the PubAcks: one connection delivers
// in the order it was given, so the stream stores the batches in turn
// while their fsyncs and acks overlap.
func (s *Scheduler) publishDue(ctx context.Context, items []*dueItem, now, selected time.Time, order *turn) {
	// One deadline for the whole batch: past the connection's cap on
	// outstanding publishes a publish waits for PubAcks (a server that
	// fsyncs every write sets the pace), but the claim's row locks are
	// held meanwhile, so the batch as a whole waits at most publishTimeout.
	// Rows not handed over stay scheduled for the next pass.
	deadline := time.Now().Add(publishTimeout)
	stalled := false
	for _, it := range items {
		if stalled {
			continue
		}
		r := it.row.Retry
		var next time.Time
		if r.NextAttemptAt != nil {
			next = *r.NextAttemptAt
		}
		dd := &contract.DueData{
			Kind: r.Kind, ID: r.ItemID, Attempt: r.Attempt, NextAttemptAt: next,
			JobType: r.JobType, Source: r.Source, Payload: r.Payload, Checkpoint: r.Checkpoint, Metadata: r.Metadata,
			MaxRetries: r.MaxRetriesOverride, Priority: contract.Priority(r.Priority),
		}
		if !r.RetryEnabled {
			dd.RetryEnabled = &r.RetryEnabled
		}
		if r.TimeoutMS != nil {
			dd.TimeoutMS = *r.TimeoutMS
		}
		msg, err := contract.NewLifecycleMsg(source, contract.Due, dd, now)
		if err != nil {
			it.buildErr = err
			s.metrics.errors.WithLabelValues("due").Inc()
			s.log.Error().Err(err).Str("kind", r.Kind).Str("id", r.ItemID).Int("attempt", r.Attempt).Msg("build due event")
			continue
		}
		it.msg = msg
		// The due continues the trace of the decision that scheduled it.
		_, it.span = tracing.StartPublish(tracing.WithTraceparent(ctx, r.TraceContext), msg, attribute.String("retryd.kind", r.Kind),
			attribute.String("retryd.id", r.ItemID), attribute.Int("retryd.attempt", r.Attempt), attribute.Bool("retryd.redue", it.redue))
		it.late = it.row.Lateness + time.Since(selected)
		it.ack, err = s.cfg.JS.PublishMsgAsync(msg, jetstream.WithStallWait(max(time.Until(deadline), time.Millisecond)))
		if err != nil {
			s.log.Warn().Err(err).Str("kind", r.Kind).Str("id", r.ItemID).Msg("publish due event")
			it.ack = nil
			stalled = errors.Is(err, jetstream.ErrTooManyStalledMsgs)
		}
	}
	order.end(ctx)
	wait, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	defer endDueSpans(items)
	for _, it := range items {
		if it.ack == nil {
			continue
		}
		select {
		case pa := <-it.ack.Ok():
			it.ok, it.dup = true, pa.Duplicate
		case err := <-it.ack.Err():
			s.log.Warn().Err(err).Str("kind", it.row.Kind).Str("id", it.row.ItemID).Msg("due event not acknowledged")
		case <-wait.Done():
			return
		}
	}
}

func endDueSpans(items []*dueItem) {
	for _, it := range items {
		if it.span == nil {
			continue
		}
		if !it.ok {
			tracing.Fail(it.span, errors.New("due event not acknowledged"))
		}
		it.span.End()
	}
}

func (s *Scheduler) observeDue(items []*dueItem) {
	for _, it := range items {
		if !it.ok {
			continue
		}
		r := it.row.Retry
		switch {
		case it.dup:
			s.metrics.dueDuplicates.WithLabelValues(r.Kind).Inc()
		case it.redue:
			s.metrics.redue.WithLabelValues(r.Kind).Inc()
		default:
			s.metrics.due.WithLabelValues(r.Kind).Inc()
			s.metrics.lateness.Observe(it.late.Seconds())
		}
		s.log.Debug().Str("kind", r.Kind).Str("id", r.ItemID).Int("attempt", r.Attempt).
			Bool("redue", it.redue).Bool("duplicate", it.dup).Dur("lateness", it.late).Msg("due")
	}
}
