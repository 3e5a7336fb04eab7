package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/tracing"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/retrystore"
)

// nakDelay is how long a message whose transaction failed waits before it
// is redelivered.
const nakDelay = 5 * time.Second

// busyDelay is how long a fact whose item another transaction holds waits
// before it comes back: 50 ms on its first hand-back, doubling with each
// delivery up to nakDelay. The holder is nearly always the due loop's
// claim, which publishes the due inside its transaction, so a fast
// owner's outcome can arrive before that commit and only needs a moment;
// a peer frozen mid-transaction (fault scenario 3) costs a few
// redeliveries, not a stall.
func busyDelay(delivered uint64) time.Duration {
	d := 50 * time.Millisecond
	for i := uint64(1); i < delivered && d < nakDelay; i++ {
		d *= 2
	}
	return min(d, nakDelay)
}

// inbound is a decoded message waiting to be applied.
type inbound struct {
	msg jetstream.Msg
	f   fact
	// ctx carries the message's consumer span (see traceBatch); the
	// outbox rows written for it continue that trace.
	ctx  context.Context
	span trace.Span
}

// applied is the result of applying one message.
type applied struct {
	in        inbound
	ch        change
	duplicate bool
	// busy: another transaction holds the item; the fact is handed back.
	busy bool
}

// errLeftForRedelivery is the policy stage's answer for every message it
// did not settle: it left those on purpose (a failpoint fired after the
// commit, or it is stopping mid-transaction), to be delivered again after
// AckWait as if the process had died there.
var errLeftForRedelivery = fmt.Errorf("policy stage left the message for redelivery: %w", durable.ErrAbandon)

// handleMessages is the policy stage's batch handler: the consumer
// runtime hands it what was delivered, up to ConsumeBatch. handleBatch
// settles each message itself.
func (s *Scheduler) handleMessages(ctx context.Context, msgs []jetstream.Msg) error {
	s.handleBatch(ctx, msgs)
	return errLeftForRedelivery
}

// decode checks a message; malformed ones are terminated and counted.
func (s *Scheduler) decode(m jetstream.Msg) (inbound, bool) {
	ev, err := contract.DecodeLifecycle(m.Subject(), m.Data())
	if err == nil {
		switch ev.Event {
		case contract.Failed, contract.Succeeded, contract.Cancelled, contract.Held, contract.Released:
		default:
			err = fmt.Errorf("event %q is not consumed by the scheduler (failed, held, released, succeeded, cancelled)", ev.Event)
		}
	}
	if err == nil {
		// A fact must carry the id it is deduplicated on, and its Retryd-*
		// headers must not say something the body does not.
		err = contract.CheckLifecycleHeaders(m.Headers(), ev)
	}
	if err != nil {
		s.terminate(m, contract.LogReason(err))
		return inbound{}, false
	}
	return inbound{msg: m, f: newFact(ev, ev.Envelope.ID)}, true
}

// terminate ends a message that can never be applied, with a reason that
// names the rule broken and no value, and counts it.
func (s *Scheduler) terminate(m jetstream.Msg, reason string) {
	if err := m.TermWithReason(reason); err != nil {
		s.log.Warn().Err(err).Str("subject", m.Subject()).Msg("terminate message")
	}
	s.metrics.malformed.WithLabelValues(Owner).Inc()
	s.log.Warn().Str("subject", m.Subject()).Str("reason", reason).Msg("message terminated: it can never be applied")
}

// uniqueViolation is SQLSTATE unique_violation.
const uniqueViolation = "23505"

// unappliable reports whether err, from applying one message alone, will
// come back at every redelivery: Postgres refused the data itself (class
// 22, data exception) or a constraint other than a unique key (class 23;
// a unique violation can be a race between two instances and is retried).
// Connection, lock and serialization errors are retried.
func unappliable(err error) (string, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return "", false
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "22"),
		strings.HasPrefix(pgErr.Code, "23") && pgErr.Code != uniqueViolation:
		reason := "refused by the database: SQLSTATE " + pgErr.Code
		if pgErr.ConstraintName != "" {
			reason += " (constraint " + pgErr.ConstraintName + ")"
		}
		return reason, true
	}
	return "", false
}

// traceBatch starts the consumer span of each item, continuing the trace
// in its headers, and returns the func ending them with *err.
func traceBatch(ctx context.Context, consumer string, items []inbound, err *error) func() {
	for i := range items {
		in := &items[i]
		in.ctx, in.span = tracing.StartConsume(ctx, in.msg.Subject(), consumer, in.msg.Headers(),
			attribute.String("retryd.kind", in.f.ev.Kind), attribute.String("retryd.id", in.f.ev.ID),
			attribute.Int("retryd.attempt", in.f.ev.Attempt()), attribute.String("retryd.event", string(in.f.ev.Event)))
	}
	return func() {
		for _, in := range items {
			tracing.Fail(in.span, *err)
			in.span.End()
		}
	}
}

// handleBatch decodes, applies in one transaction (falling back to one
// transaction per message if the batch fails), then publishes the outbox,
// wakes the due loop and acks.
//
// A release updates many rows set-based, in a transaction of its own, so
// it splits the batch: the facts before it in the stream apply first,
// then the release, then the facts after it. An owner that admits the
// released items itself publishes their succeeded right behind the
// release, often in the same batch: applied before it, they would close
// the rows the release had to record (its decided_by "resume" history).
// (A release that runs behind its owner writes nothing on the rows at
// first, and the close records it; releaseparts.go.)
func (s *Scheduler) handleBatch(ctx context.Context, msgs []jetstream.Msg) {
	items := make([]inbound, 0, len(msgs))
	for _, m := range msgs {
		in, ok := s.decode(m)
		switch {
		case !ok:
		case in.f.ev.Event == contract.Released:
			s.applyItems(ctx, items)
			items = nil
			s.handleRelease(ctx, in)
		default:
			items = append(items, in)
		}
	}
	s.applyItems(ctx, items)
}

// applyItems applies decoded facts that hold no release (see handleBatch).
func (s *Scheduler) applyItems(ctx context.Context, items []inbound) {
	if len(items) == 0 {
		return
	}
	// A message delivered before and not acked may be the one that failed
	// its batch, so redelivered messages are applied in a batch of their
	// own: a poison fact then fails only that batch (which falls back to
	// one transaction per message) and never a batch of fresh facts. They
	// are not applied one by one up front: after a kill, the dead
	// instance's whole share comes back at once.
	if len(items) > 1 {
		var fresh, again []jetstream.Msg
		for _, in := range items {
			if md, mdErr := in.msg.Metadata(); mdErr == nil && md.NumDelivered > 1 {
				again = append(again, in.msg)
				continue
			}
			fresh = append(fresh, in.msg)
		}
		if len(again) > 0 && len(fresh) > 0 {
			s.handleBatch(ctx, again)
			s.handleBatch(ctx, fresh)
			return
		}
	}
	var err error
	defer traceBatch(ctx, ConsumerNameOf(s.cfg.Shard), items, &err)()
	// Same order for every transaction touching the same items makes
	// deadlocks between instances unlikely; stable keeps each item's facts
	// in stream order.
	slices.SortStableFunc(items, func(a, b inbound) int {
		return cmp.Or(cmp.Compare(a.f.ev.Kind, b.f.ev.Kind), cmp.Compare(a.f.ev.ID, b.f.ev.ID))
	})
	var results []applied
	results, err = s.applyBatch(ctx, items)
	if err != nil && len(items) > 1 {
		s.log.Warn().Err(err).Int("messages", len(items)).Msg("batch failed, applying messages one by one")
		for _, in := range items {
			s.handleBatch(ctx, []jetstream.Msg{in.msg})
		}
		return
	}
	if err != nil {
		s.metrics.errors.WithLabelValues("policy").Inc()
		if ctx.Err() != nil {
			return // stopping: the message is redelivered to whoever runs next
		}
		if reason, ok := unappliable(err); ok {
			s.terminate(items[0].msg, reason)
			return
		}
		s.log.Error().Err(err).Str("kind", items[0].f.ev.Kind).Str("id", items[0].f.ev.ID).
			Str("event", string(items[0].f.ev.Event)).Msg("apply message failed, redelivering later")
		_ = items[0].msg.NakWithDelay(nakDelay)
		return
	}
	if err := s.cfg.Failpoint.At(ctx, FailpointPolicyCommitted); err != nil {
		s.log.Warn().Err(err).Msg("not publishing, not acking")
		return
	}
	s.afterCommit(results)
}

func (s *Scheduler) afterCommit(results []applied) {
	kick := false
	for _, r := range results {
		if len(r.ch.msgs) > 0 {
			kick = true
		}
		s.observe(r)
		if row := r.ch.row; row != nil && row.State == retrystore.StateScheduled && row.NextAttemptAt != nil {
			s.wakeDueLoop(row.NextAttemptAt.UnixNano())
		}
	}
	if kick {
		s.relay.Kick()
	}
	for _, r := range results {
		if r.busy {
			// Redelivered when the holder has finished or its
			// transaction was ended with its connection.
			n := uint64(1)
			if md, err := r.in.msg.Metadata(); err == nil {
				n = md.NumDelivered
			}
			_ = r.in.msg.NakWithDelay(busyDelay(n))
			continue
		}
		s.lag.applied(r.in.msg)
		if err := r.in.msg.Ack(); err != nil {
			s.log.Debug().Err(err).Str("kind", r.in.f.ev.Kind).Str("id", r.in.f.ev.ID).Msg("ack failed; the redelivery will be a duplicate")
		}
	}
}

// observe counts and logs one applied message.
func (s *Scheduler) observe(r applied) {
	ev := r.in.f.ev
	switch {
	case r.duplicate:
		s.metrics.duplicate.WithLabelValues(Owner).Inc()
		return
	case r.busy:
		s.metrics.busy.Inc()
		s.log.Debug().Str("kind", ev.Kind).Str("id", ev.ID).Str("event", string(ev.Event)).
			Msg("item held by another transaction, fact handed back")
		return
	case r.ch.stale:
		s.metrics.stale.WithLabelValues(ev.Kind, string(ev.Event)).Inc()
		s.log.Info().Str("kind", ev.Kind).Str("id", ev.ID).Int("attempt", ev.Attempt()).
			Str("event", string(ev.Event)).Msg("stale fact ignored")
		return
	case r.ch.untracked:
		return
	}
	s.metrics.outcome(r.ch.outcome, ev.Kind)
	row := r.ch.row
	if r.ch.outcome == contract.Exhausted {
		s.metrics.exhaustedRow(row)
	}
	l := s.log.Debug()
	if r.ch.outcome == contract.Exhausted || r.ch.outcome == contract.Cancelled {
		l = s.log.Info()
	}
	l = l.Str("kind", row.Kind).Str("id", row.ItemID).Int("attempt", row.Attempt).Str("state", string(row.State))
	if row.NextAttemptAt != nil && row.State == retrystore.StateScheduled {
		l = l.Time("next_attempt_at", *row.NextAttemptAt)
	}
	if row.LastErrorClass != "" {
		l = l.Str("class", row.LastErrorClass)
	}
	if row.ExhaustedReason != "" {
		l = l.Str("reason", row.ExhaustedReason)
	} else if row.LastReason != "" {
		l = l.Str("reason", row.LastReason)
	}
	l.Str("event", string(ev.Event)).Str("outcome", string(r.ch.outcome)).Msg("applied")
}

// applyBatch applies items in one transaction, set-based: one statement
// reads and locks every row, one claims every message id in the inbox,
// the decisions are made in memory in stream order (an item with several
// facts in the batch sees its own earlier changes), one round trip saves
// the rows, one COPY writes the history and one statement the outbox.
func (s *Scheduler) applyBatch(ctx context.Context, items []inbound) ([]applied, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	now, err := retrystore.DBNow(ctx, tx)
	if err != nil {
		return nil, err
	}
	keys := make([]retrystore.Key, 0, len(items))
	for _, in := range items {
		keys = append(keys, retrystore.Key{Kind: in.f.ev.Kind, ItemID: in.f.ev.ID})
	}
	busy, err := retrystore.TryLockItems(ctx, tx, keys)
	if err != nil {
		return nil, err
	}
	free := make([]retrystore.Key, 0, len(items))
	for _, k := range keys {
		if !busy[k] {
			free = append(free, k)
		}
	}
	// The rows are locked without waiting, and before the inbox claims so
	// that a busy item's fact is not claimed: the advisory lock does not
	// cover the row locks of the due loop, the releases and the operator
	// actions (TryGetManyForUpdate). Taking them first adds no wait: this
	// step never waits. An item without a row is inserted by SaveMany;
	// the only writers that insert a row under a peer's feet hold its
	// advisory lock (this stage), or are short (a shard move, a rebuild),
	// so that insert waits on no frozen peer.
	locked, rowBusy, err := retrystore.TryGetManyForUpdate(ctx, tx, free)
	if err != nil {
		return nil, err
	}
	for k := range rowBusy {
		busy[k] = true
	}
	ids := make([]string, 0, len(items))
	for i, in := range items {
		if !busy[keys[i]] {
			ids = append(ids, in.f.msgID)
		}
	}
	claimed, err := inbox.ClaimMany(ctx, tx, Owner, ids)
	if err != nil {
		return nil, err
	}
	rows := make(map[retrystore.Key]*retrystore.Retry, len(locked))
	for k, r := range locked {
		rows[k] = &r
	}
	d := &decider{rand: s.cfg.Rand, policies: policyCache{}}
	results := make([]applied, 0, len(items))
	var (
		saves   []*retrystore.Retry
		history []retrystore.HistoryEntry
		msgs    []*nats.Msg
	)
	for i, in := range items {
		if busy[keys[i]] {
			results = append(results, applied{in: in, busy: true})
			continue
		}
		if !claimed[in.f.msgID] {
			results = append(results, applied{in: in, duplicate: true})
			continue
		}
		delete(claimed, in.f.msgID) // a second copy in this batch is a duplicate
		ictx := ctx
		if in.ctx != nil {
			ictx = in.ctx
		}
		ch, err := s.decideOne(ictx, tx, d, rows[keys[i]], in.f, now)
		if err != nil {
			return nil, fmt.Errorf("apply %s %s/%s: %w", in.f.ev.Event, in.f.ev.Kind, in.f.ev.ID, err)
		}
		if ch.row != nil {
			stampTrace(ictx, ch.row)
			rows[keys[i]] = ch.row
			saves = append(saves, ch.row)
		}
		history = append(history, ch.history...)
		for _, m := range ch.msgs {
			// Each message carries the trace of its own input; the
			// outbox insert below runs once for the whole batch.
			tracing.Inject(ictx, m.Header)
		}
		msgs = append(msgs, ch.msgs...)
		results = append(results, applied{in: in, ch: ch})
	}
	if err := retrystore.SaveMany(ctx, tx, saves); err != nil {
		return nil, err
	}
	if err := retrystore.InsertHistory(ctx, tx, history...); err != nil {
		return nil, err
	}
	if err := outbox.Insert(ctx, tx, Owner, msgs...); err != nil {
		return nil, fmt.Errorf("insert outbox: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return results, nil
}

// decideOne computes the change one fact makes to its item's row (nil:
// the item has none yet).
func (s *Scheduler) decideOne(ctx context.Context, tx pgx.Tx, d *decider, row *retrystore.Retry, f fact, now time.Time) (change, error) {
	if hd, ok := heldFact(f); ok {
		return s.applyHeld(ctx, tx, d, row, f, hd, now)
	}
	switch f.ev.Event {
	case contract.Failed:
		return s.applyFailed(ctx, tx, d, row, f, now)
	case contract.Succeeded:
		return applySucceeded(row, f), nil
	case contract.Cancelled:
		return applyCancelled(row, f), nil
	}
	return change{}, nil
}

// stampTrace keeps, on a row that now waits for its due, the trace of what
// scheduled it (see Retry.TraceContext); "" when ctx has no span.
func stampTrace(ctx context.Context, r *retrystore.Retry) {
	if r.State == retrystore.StateScheduled {
		r.TraceContext = tracing.Traceparent(ctx)
	}
}

// applyFailed records a failure and decides what follows.
func (s *Scheduler) applyFailed(ctx context.Context, tx pgx.Tx, d *decider, row *retrystore.Retry, f fact, now time.Time) (change, error) {
	fd := f.ev.Failed
	if !acceptsFailure(row, fd.Attempt) {
		return staleChange(), nil
	}
	class := classify(s.cfg.Classifier, fd.Error)
	var history []retrystore.HistoryEntry
	if due, ok := lateDue(row, fd.Attempt, f.at); ok {
		history = append(history, due)
	}
	r, h := recordFailure(row, f, string(class))
	return d.decide(ctx, tx, r, failure{class: class, message: fd.Error.Message, retryAfter: fd.RetryAfter, nonRetryable: fd.Error.NonRetryable},
		append(history, h), now)
}

// lockRow reads and locks the row of an item; nil when it has none.
func lockRow(ctx context.Context, tx pgx.Tx, kind, id string) (*retrystore.Retry, error) {
	r, err := retrystore.GetForUpdate(ctx, tx, kind, id)
	if errors.Is(err, pgdb.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// write stores a change: row, history and outbox messages.
func write(ctx context.Context, tx pgx.Tx, ch change) error {
	if ch.row != nil {
		stampTrace(ctx, ch.row)
		saved, err := retrystore.Save(ctx, tx, *ch.row)
		if err != nil {
			return err
		}
		*ch.row = saved
	}
	if err := retrystore.InsertHistory(ctx, tx, ch.history...); err != nil {
		return err
	}
	if len(ch.msgs) > 0 {
		if err := outbox.Insert(ctx, tx, Owner, ch.msgs...); err != nil {
			return fmt.Errorf("insert outbox: %w", err)
		}
	}
	return nil
}

// begin starts a transaction whose lock waits are bounded by
// Config.LockTimeout, so a hung instance holding a row cannot stall this
// one.
func (s *Scheduler) begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.cfg.Pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	// SET takes no parameters; the value is an integer we formatted.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", s.cfg.LockTimeout.Milliseconds())); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("set lock timeout: %w", err)
	}
	return tx, nil
}
