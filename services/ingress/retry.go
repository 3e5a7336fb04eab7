package ingress

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/pkg/durable"
	"github.com/retryd/retryd/projections/inbox"
	"github.com/retryd/retryd/projections/ingressstore"
	"github.com/retryd/retryd/projections/outbox"
)

// A due for an ended deferral that does not know its attempt is handed back
// unconfirmedDeliveries-1 times, unconfirmedDelay apart, for the manual
// retry's rescheduled event to reopen the deferral; then it is acked
// unclaimed and the scheduler's re-emission (after its RedueAfter) runs it.
const (
	unconfirmedDeliveries = 6
	unconfirmedDelay      = time.Second
)

// Values of CancelledData.By and reasons ingress cancels with.
const (
	cancelledByIngress     = "ingress"
	reasonEventMissing     = "event_missing"
	reasonTypeNotAllowed   = "type_not_allowed"
	defaultCancelledByUser = "operator"
)

// Keys ingress keeps in event_ingress_retries.metadata about a
// cancellation.
const (
	mdCancelledBy     = "cancelled_by"
	mdCancelReason    = "cancel_reason"
	mdCancelPublished = "cancel_published"
)

// dueOutcome is what handling a due event did, for metrics and logs after
// the commit.
type dueOutcome struct {
	ev      ingressstore.Event
	source  string
	what    string // "duplicate", "evaluated", "admitted_before", "cancelled_before", "exhausted_before", "unconfirmed", "stale", "missing", "type_cancelled", "resolved"
	verdict ingressstore.Verdict
}

// handleDue evaluates a deferred event again when the scheduler says its
// next attempt is due.
func (s *Service) handleDue(ctx context.Context, msg jetstream.Msg) error {
	lc, err := contract.DecodeLifecycle(msg.Subject(), msg.Data())
	if err != nil {
		return err
	}
	if lc.Kind != contract.KindEvent || lc.Due == nil {
		return invalid("subject", fmt.Sprintf("%s is not an event due", msg.Subject()))
	}
	due := lc.Due
	msgID := lifecycleMsgID(msg, lc)
	var delivered uint64 = 1
	if md, err := msg.Metadata(); err == nil {
		delivered = md.NumDelivered
	}
	var out dueOutcome
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		out = dueOutcome{source: due.Source}
		return s.decideDue(ctx, tx, msgID, due, delivered < unconfirmedDeliveries, &out)
	})
	if err != nil {
		return fmt.Errorf("handle due %s: %w", msgID, err)
	}
	switch out.what {
	case "duplicate":
		return nil
	case "unconfirmed":
		return durable.NakAfter(unconfirmedDelay)
	}
	if err := s.failpoint(FailpointRetryCommitted); err != nil {
		return err
	}
	s.relay.Kick()
	s.metrics.retry(out.source, retryDue)
	log := s.log.Info().Str("source", out.source).Str("event_id", due.ID).Int("attempt", due.Attempt)
	switch out.what {
	case "evaluated":
		if !out.verdict.Admitted {
			s.metrics.gate.WithLabelValues(s.metrics.sources.label(out.source), decisionDeferred).Inc()
		}
		s.logVerdict(out.ev, due.Attempt, out.verdict)
		return nil
	case "missing":
		s.metrics.retry(out.source, retryCancelled)
		log.Str("reason", reasonEventMissing).Msg("due event for an event not in the database: cancelled")
	case "type_cancelled":
		s.metrics.retry(out.source, retryCancelled)
		log.Str("reason", reasonTypeNotAllowed).Msg("deferred event's type is no longer allowed: cancelled")
	default:
		log.Str("status", string(out.ev.Status)).Str("outcome", out.what).Msg("due event needs no evaluation")
	}
	return nil
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
// is true it comes back as "unconfirmed", to be delivered again shortly.
func (s *Service) decideDue(ctx context.Context, tx pgx.Tx, msgID string, due *contract.DueData, wait bool, out *dueOutcome) error {
	now := s.cfg.Now()
	claim := func() (bool, error) {
		first, err := inbox.Claim(ctx, tx, ConsumerRetry, msgID)
		if err == nil && !first {
			out.what = "duplicate"
		}
		return first, err
	}
	ev, err := ingressstore.LockEvent(ctx, tx, due.ID)
	if errors.Is(err, ingressstore.ErrNotFound) {
		if first, err := claim(); err != nil || !first {
			return err
		}
		// Nothing to evaluate (e.g. the database was restored from an older
		// backup): close the retry instead of letting it come back.
		out.what = "missing"
		m, err := cancelledMsg(due.ID, due.Attempt, cancelledByIngress,
			reasonEventMissing+": event "+due.ID+" is not in workflow_events", now)
		if err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, OutboxOwner, m)
	}
	if err != nil {
		return err
	}
	out.ev = ev
	out.source = ev.Source
	if ev.Status != ingressstore.StatusCancelled && ev.Status != ingressstore.StatusExhausted {
		if first, err := claim(); err != nil || !first {
			return err
		}
	}
	switch ev.Status {
	case ingressstore.StatusAdmitted:
		// Admitted already (a duplicate due, or the succeeded was lost):
		// tell the scheduler again so it closes the retry.
		out.what = "admitted_before"
		m, err := succeededMsg(ev.ID, ev.Source, due.Attempt, now)
		if err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, OutboxOwner, m)
	case ingressstore.StatusExhausted, ingressstore.StatusCancelled:
		r, err := ingressstore.GetRetry(ctx, tx, ev.ID)
		if errors.Is(err, ingressstore.ErrNotFound) {
			out.what = "resolved"
			return nil
		}
		if err != nil {
			return err
		}
		if wait && due.Attempt > max(r.Attempts, r.ScheduledAttempt) {
			out.what = "unconfirmed"
			return nil
		}
		if ev.Status == ingressstore.StatusExhausted {
			// Ended by the scheduler, which knows it.
			out.what = "exhausted_before"
			return nil
		}
		// Not admitted. When ingress published the cancellation, publish
		// it again (same Nats-Msg-Id as the first) in case the scheduler
		// never received it; a cancellation from the scheduler it knows.
		out.what = "cancelled_before"
		if published, _ := r.Metadata[mdCancelPublished].(bool); !published {
			return nil
		}
		by, _ := r.Metadata[mdCancelledBy].(string)
		reason, _ := r.Metadata[mdCancelReason].(string)
		m, err := cancelledMsg(ev.ID, r.Attempts, by, reason, now)
		if err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, OutboxOwner, m)
	case ingressstore.StatusDeferred:
	default:
		out.what = "resolved"
		return nil
	}
	last := due.Attempt - 1
	r, err := ingressstore.GetRetry(ctx, tx, ev.ID)
	switch {
	case errors.Is(err, ingressstore.ErrNotFound):
	case err != nil:
		return err
	case due.Attempt <= r.Attempts:
		// This attempt was evaluated already (a replay older than the inbox).
		out.what = "stale"
		return nil
	default:
		last = r.Attempts
	}
	v, err := ingressstore.GateDue(ctx, tx, ev.Source, ev.Type, ev.ID, due.NextAttemptAt)
	if errors.Is(err, ingressstore.ErrTypeNotAllowed) {
		out.what = "type_cancelled"
		return s.cancelDeferral(ctx, tx, ev, last, cancelledByIngress, reasonTypeNotAllowed+": "+err.Error())
	}
	if err != nil {
		return err
	}
	out.what = "evaluated"
	out.verdict = v
	return s.apply(ctx, tx, ev, due.Attempt, v)
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

// lifecycleMsgID is the message's Nats-Msg-Id, or the envelope id (they
// are the same for messages built by contract.NewLifecycleMsg).
func lifecycleMsgID(msg jetstream.Msg, lc contract.LifecycleEvent) string {
	if h := msg.Headers(); h != nil {
		if id := h.Get(nats.MsgIdHdr); id != "" {
			return id
		}
	}
	return lc.Envelope.ID
}
