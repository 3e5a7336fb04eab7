package ingress

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/lifecyclemsg"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// A due for an ended deferral that does not know its attempt is handed back
// unconfirmedDeliveries-1 times, unconfirmedDelay apart, for the manual
// retry's rescheduled event to reopen the deferral; then it is acked
// unclaimed and the scheduler's re-emission (after its RedueAfter) runs it.
const (
	unconfirmedDeliveries = 6
	unconfirmedDelay      = time.Second
)

// windowFilledRetry is when a message whose admission lost the race for
// the last room of a rate window (ingressstore.ErrWindowFilled) is
// evaluated again: at once, as it rolled back and holds nothing.
const windowFilledRetry = time.Millisecond

// Values of CancelledData.By and reasons ingress cancels with.
const (
	cancelledByIngress   = "ingress"
	reasonEventMissing   = "event_missing"
	reasonTypeNotAllowed = "type_not_allowed"
)

// Keys ingress keeps in event_ingress_retries.metadata about a
// cancellation.
const (
	mdCancelledBy     = "cancelled_by"
	mdCancelReason    = "cancel_reason"
	mdCancelPublished = "cancel_published"
)

// dueResult is what handling a due event did.
type dueResult int

const (
	// dueUndecided is the zero value: a step that returns it forgot to
	// decide, which handleDue refuses to commit.
	dueUndecided dueResult = iota
	// dueDuplicate: the inbox had the due already.
	dueDuplicate
	// dueEvaluated: the gate looked at the deferred event again.
	dueEvaluated
	// dueAdmittedBefore: admitted already; the succeeded is sent again.
	dueAdmittedBefore
	// dueCancelledBefore: cancelled already; a cancellation ingress
	// published is sent again.
	dueCancelledBefore
	// dueExhaustedBefore: exhausted by the scheduler, which knows.
	dueExhaustedBefore
	// dueUnconfirmed: a due for an attempt the ended deferral never heard
	// of; handed back to wait for the rescheduled event that reopens it.
	dueUnconfirmed
	// dueStale: a replay of an attempt evaluated already.
	dueStale
	// dueMissing: the event is not in the database; the retry is cancelled.
	dueMissing
	// dueTypeCancelled: the source no longer allows the event's type.
	dueTypeCancelled
	// dueResolved: nothing left to do (no retry row, or a status that
	// takes no due).
	dueResolved
)

func (r dueResult) String() string {
	return [...]string{"undecided", "duplicate", "evaluated", "admitted_before", "cancelled_before", "exhausted_before",
		"unconfirmed", "stale", "missing", "type_cancelled", "resolved"}[r]
}

// dueOutcome is what handling a due event did, for metrics and logs after
// the commit.
type dueOutcome struct {
	ev      ingressstore.Event
	source  string
	result  dueResult
	verdict ingressstore.Verdict
}

// dueAnswer is how the due of it is settled once its source's
// transaction committed (it.err is its decision's error, rolled back to
// its savepoint): handed back to wait for its turn or a line, evaluated
// again at once, or acked. decided reports a decision that committed
// something (the failpoint's point).
func (s *Service) dueAnswer(ctx context.Context, it *dueItem) (answer error, decided bool) {
	due := it.due
	if line, ok := errors.AsType[*ingressstore.LineError](it.err); ok {
		// Rolled back, claim included: the same due comes back once the
		// releaser had time to admit the event (or the event left the
		// line), at most a minute from now, each time.
		s.metrics.retry(due.Source, retryWaited)
		return durable.NakAfter(min(max(line.Until.Sub(line.Now), time.Millisecond), maxLineWait)), false
	}
	var turn *ingressstore.WaitError
	if errors.As(it.err, &turn) {
		// Rolled back: the hold keeps its place, and the same due comes
		// back at the holder's turn (no new due, nothing to tell the
		// scheduler).
		s.metrics.retry(due.Source, retryWaited)
		if !turn.Behind {
			if err := ingressstore.MarkWaiting(ctx, s.cfg.Pool, due.ID, turn.Until); err != nil {
				return err, false
			}
		}
		return durable.NakAfter(max(turn.Until.Sub(turn.Now), time.Millisecond)), false
	}
	switch {
	case errors.Is(it.err, ingressstore.ErrWindowFilled):
		return durable.NakAfter(windowFilledRetry), false
	case it.err != nil:
		return fmt.Errorf("handle due %s: %w", it.msgID, it.err), false
	case it.out.result == dueDuplicate:
		return nil, false
	case it.out.result == dueUnconfirmed:
		return durable.NakAfter(unconfirmedDelay), false
	}
	return nil, true
}

// reportLate counts and logs the late holders a due admitted ahead of its
// own event (ingressstore.Verdict.Before).
func (s *Service) reportLate(by string, late []ingressstore.Released) {
	for _, ev := range late {
		if ev.Attempt > 0 {
			s.metrics.retry(ev.Source, retryCompleted)
		}
		s.log.Info().Str("source", ev.Source).Str("event_id", ev.ID).Int("attempt", ev.Attempt).Str("ahead_of", by).
			Msg("late slot holder admitted in its place, ahead of the holder behind it")
	}
}

// decodeDue validates a message of retry.event.due.<id> and returns its
// due and its message id.
func decodeDue(msg jetstream.Msg) (*contract.DueData, string, error) {
	lc, err := lifecyclemsg.Decode(msg, contract.KindEvent, contract.Due)
	if err != nil {
		return nil, "", err
	}
	return lc.Due, lifecyclemsg.InboxID(msg, lc.Envelope), nil
}

// reportDue counts and logs a due handled and committed.
func (s *Service) reportDue(due *contract.DueData, out dueOutcome) {
	s.metrics.retry(out.source, retryDue)
	log := s.log.Info().Str("source", out.source).Str("event_id", due.ID).Int("attempt", due.Attempt)
	switch out.result {
	case dueEvaluated:
		if !out.verdict.Admitted {
			s.metrics.gate.WithLabelValues(s.metrics.sources.label(out.source), decisionDeferred).Inc()
		}
		s.reportLate(due.ID, out.verdict.Before)
		s.logVerdict(out.ev, due.Attempt, out.verdict)
	case dueMissing:
		s.metrics.retry(out.source, retryCancelled)
		log.Str("reason", reasonEventMissing).Msg("due event for an event not in the database: cancelled")
	case dueTypeCancelled:
		s.metrics.retry(out.source, retryCancelled)
		log.Str("reason", reasonTypeNotAllowed).Msg("deferred event's type is no longer allowed: cancelled")
	default:
		log.Str("status", string(out.ev.Status)).Str("outcome", out.result.String()).Msg("due event needs no evaluation")
	}
}

// decideDue decides a due event inside tx. The event's row is locked
// first; the due is claimed in the inbox only when it is decided on, not
// for a deferral that ended: a manual retry's due may arrive before the
// rescheduled event that reopens the deferral, and the scheduler's
// re-emission of the due (same Nats-Msg-Id) must then be evaluated.
//
// A due for an attempt an ended deferral never heard of is, most likely, an
// operator's manual retry whose rescheduled event (which reopens the
// deferral) is applied by the other consumer a moment later: while wait
// is true it comes back as dueUnconfirmed, to be delivered again shortly.
func (s *Service) decideDue(ctx context.Context, tx pgx.Tx, msgID string, due *contract.DueData, wait bool) (dueOutcome, error) {
	out := dueOutcome{source: due.Source}
	ev, err := ingressstore.LockEvent(ctx, tx, due.ID)
	if errors.Is(err, pgdb.ErrNotFound) {
		return s.dueForMissingEvent(ctx, tx, msgID, due)
	}
	if err != nil {
		return out, err
	}
	out.ev, out.source = ev, ev.Source
	if ev.Status != ingressstore.StatusCancelled && ev.Status != ingressstore.StatusExhausted {
		if first, err := inbox.Claim(ctx, tx, ConsumerRetry, msgID); err != nil || !first {
			out.result = dueDuplicate
			return out, err
		}
	}
	switch ev.Status {
	case ingressstore.StatusAdmitted:
		return s.dueForAdmittedEvent(ctx, tx, due, out)
	case ingressstore.StatusExhausted, ingressstore.StatusCancelled:
		return s.dueForEndedDeferral(ctx, tx, due, wait, out)
	case ingressstore.StatusDeferred:
		return s.dueForDeferredEvent(ctx, tx, due, out)
	default:
		out.result = dueResolved
		return out, nil
	}
}

// dueForMissingEvent closes the retry of an event the database does not
// have (e.g. restored from an older backup) instead of letting it come
// back.
func (s *Service) dueForMissingEvent(ctx context.Context, tx pgx.Tx, msgID string, due *contract.DueData) (dueOutcome, error) {
	out := dueOutcome{source: due.Source, result: dueDuplicate}
	if first, err := inbox.Claim(ctx, tx, ConsumerRetry, msgID); err != nil || !first {
		return out, err
	}
	out.result = dueMissing
	m, err := cancelledMsg(due.ID, due.Attempt, cancelledByIngress,
		reasonEventMissing+": event "+due.ID+" is not in workflow_events", s.cfg.Now())
	if err != nil {
		return out, err
	}
	return out, outbox.Insert(ctx, tx, OutboxOwner, m)
}

// dueForAdmittedEvent answers a due for an event admitted already (a
// duplicate due, or the succeeded was lost): the scheduler is told again
// so it closes the retry.
func (s *Service) dueForAdmittedEvent(ctx context.Context, tx pgx.Tx, due *contract.DueData, out dueOutcome) (dueOutcome, error) {
	out.result = dueAdmittedBefore
	m, err := succeededMsg(out.ev.ID, out.ev.Source, due.Attempt, s.cfg.Now())
	if err != nil {
		return out, err
	}
	return out, outbox.Insert(ctx, tx, OutboxOwner, m)
}

// dueForEndedDeferral answers a due for an event whose deferral ended,
// exhausted or cancelled.
func (s *Service) dueForEndedDeferral(ctx context.Context, tx pgx.Tx, due *contract.DueData, wait bool, out dueOutcome) (dueOutcome, error) {
	ev := out.ev
	r, err := ingressstore.GetRetry(ctx, tx, ev.ID)
	if errors.Is(err, pgdb.ErrNotFound) {
		out.result = dueResolved
		return out, nil
	}
	if err != nil {
		return out, err
	}
	if wait && due.Attempt > max(r.Attempts, r.ScheduledAttempt) {
		out.result = dueUnconfirmed
		return out, nil
	}
	if ev.Status == ingressstore.StatusExhausted {
		out.result = dueExhaustedBefore
		return out, nil
	}
	// Not admitted. When ingress published the cancellation, publish it
	// again (same Nats-Msg-Id as the first) in case the scheduler never
	// received it; a cancellation from the scheduler it knows.
	out.result = dueCancelledBefore
	if published, _ := r.Metadata[mdCancelPublished].(bool); !published {
		return out, nil
	}
	by, _ := r.Metadata[mdCancelledBy].(string)
	reason, _ := r.Metadata[mdCancelReason].(string)
	m, err := cancelledMsg(ev.ID, r.Attempts, by, reason, s.cfg.Now())
	if err != nil {
		return out, err
	}
	return out, outbox.Insert(ctx, tx, OutboxOwner, m)
}

// dueForDeferredEvent runs the gate again for a deferred event, unless the
// due is a replay of an attempt evaluated already.
func (s *Service) dueForDeferredEvent(ctx context.Context, tx pgx.Tx, due *contract.DueData, out dueOutcome) (dueOutcome, error) {
	ev := out.ev
	last := due.Attempt - 1
	r, err := ingressstore.GetRetry(ctx, tx, ev.ID)
	switch {
	case errors.Is(err, pgdb.ErrNotFound):
	case err != nil:
		return out, err
	case due.Attempt <= r.Attempts:
		out.result = dueStale
		return out, nil
	default:
		last = r.Attempts
	}
	v, err := ingressstore.GateDue(ctx, tx, ev.Source, ev.Type, ev.ID)
	if errors.Is(err, ingressstore.ErrTypeNotAllowed) {
		out.result = dueTypeCancelled
		return out, s.cancelDeferral(ctx, tx, ev, last, cancelledByIngress, reasonTypeNotAllowed+": "+err.Error())
	}
	if err != nil {
		return out, err
	}
	out.result, out.verdict = dueEvaluated, v
	return out, s.apply(ctx, tx, ev, due.Attempt, v)
}

// cancelDeferral cancels a deferred event (locked by the caller): status
// cancelled, retry row cancelled, and retry.event.cancelled.<id> so the
// scheduler closes it. attempt is the last attempt evaluated.
func (s *Service) cancelDeferral(ctx context.Context, tx pgx.Tx, ev ingressstore.Event, attempt int, by, reason string) error {
	if _, err := ingressstore.SetEventStatus(ctx, tx, ev.ID, ingressstore.StatusCancelled, ingressstore.StatusDeferred); err != nil {
		return err
	}
	if _, err := ingressstore.ResolveRetry(ctx, tx, ev.ID, ingressstore.RetryCancelled, "cancelled by "+by); err != nil {
		return err
	}
	md := map[string]any{mdCancelledBy: by, mdCancelReason: reason, mdCancelPublished: true}
	if err := ingressstore.MergeRetryMetadata(ctx, tx, ev.ID, md); err != nil {
		return err
	}
	m, err := cancelledMsg(ev.ID, max(attempt, 0), by, reason, s.cfg.Now())
	if err != nil {
		return err
	}
	return outbox.Insert(ctx, tx, OutboxOwner, m)
}
