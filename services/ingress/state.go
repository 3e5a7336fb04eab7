package ingress

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/lifecyclemsg"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/ingress/internal/ingressstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// handleRetryState keeps event_ingress_retries and the event's status in
// step with the scheduler: scheduled/rescheduled confirm a deferral and set
// its next attempt; exhausted and cancelled end it.
func (s *Service) handleRetryState(ctx context.Context, msg jetstream.Msg) error {
	lc, err := lifecyclemsg.Decode(msg, contract.KindEvent)
	if err != nil {
		return err
	}
	msgID := lifecyclemsg.InboxID(msg, lc.Envelope)
	var applied, reopened bool
	var source string
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		applied, reopened, source = false, false, ""
		first, err := inbox.Claim(ctx, tx, ConsumerRetryState, msgID)
		if err != nil || !first {
			return err
		}
		switch lc.Event {
		case contract.Scheduled, contract.Rescheduled:
			d := lc.Scheduled
			source = d.Source
			decision := map[string]any{
				"decided_by":     d.Decision.DecidedBy,
				"policy":         d.Decision.Policy,
				"policy_version": d.Decision.PolicyVersion,
				"delay_ms":       d.Decision.DelayMS,
				"retry_count":    d.Decision.RetryCount,
				"max_retries":    d.Decision.MaxRetries,
			}
			applied, err = ingressstore.ConfirmScheduled(ctx, tx, d.ID, d.Attempt, d.NextAttemptAt, decision)
			if err != nil || applied || d.Decision.DecidedBy != contract.DecidedByManual {
				return err
			}
			applied, reopened, err = s.reopenDeferral(ctx, tx, d, decision)
			return err
		case contract.Exhausted:
			d := lc.Exhausted
			lastError := fmt.Sprintf("exhausted (%s) after %d retries", d.Reason, d.RetryCount)
			source, applied, err = s.endDeferral(ctx, tx, d.ID, ingressstore.StatusExhausted, lastError, nil)
			return err
		case contract.Cancelled:
			d := lc.Cancelled
			md := map[string]any{mdCancelledBy: d.By, mdCancelReason: d.Reason}
			source, applied, err = s.endDeferral(ctx, tx, d.ID, ingressstore.StatusCancelled, "cancelled by "+d.By, md)
			return err
		}
		return invalid("subject", fmt.Sprintf("%s is not scheduled, rescheduled, exhausted or cancelled", msg.Subject()))
	})
	if err != nil {
		return fmt.Errorf("apply %s: %w", msgID, err)
	}
	if !applied {
		return nil
	}
	s.metrics.retry(source, string(lc.Event))
	log := s.log.Info().Str("source", source).Str("event_id", lc.ID).Int("attempt", lc.Attempt())
	switch lc.Event {
	case contract.Scheduled, contract.Rescheduled:
		msg := "event retry scheduled"
		if reopened {
			msg = "ended deferral retried again: deferred until its next attempt"
		}
		log.Time("next_attempt_at", lc.Scheduled.NextAttemptAt).Str("decided_by", lc.Scheduled.Decision.DecidedBy).
			Str("event", string(lc.Event)).Msg(msg)
	case contract.Exhausted:
		log.Str("reason", lc.Exhausted.Reason).Msg("event retry exhausted: the event will not be admitted")
	case contract.Cancelled:
		log.Str("by", lc.Cancelled.By).Msg("event retry cancelled")
	}
	return nil
}

// reopenDeferral applies an operator's manual retry (a rescheduled event
// decided by "manual") of an exhausted or cancelled deferral: the event is
// deferred again, and its due evaluates it like any other. Only a manual
// retry reopens: a late confirmation of the attempt that was pending when
// the deferral was cancelled must not undo the cancellation. Events in any
// other status, and confirmations no newer than what the deferral knows,
// change nothing.
func (s *Service) reopenDeferral(ctx context.Context, tx pgx.Tx, d *contract.ScheduledData, decision map[string]any) (applied, reopened bool, err error) {
	ev, err := ingressstore.LockEvent(ctx, tx, d.ID)
	if errors.Is(err, pgdb.ErrNotFound) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	if ev.Status != ingressstore.StatusExhausted && ev.Status != ingressstore.StatusCancelled {
		return false, false, nil
	}
	if reopened, err = ingressstore.ReopenRetry(ctx, tx, d.ID, d.Attempt, d.NextAttemptAt, decision); err != nil || !reopened {
		return false, false, err
	}
	if _, err := ingressstore.SetEventStatus(ctx, tx, d.ID, ingressstore.StatusDeferred, ev.Status); err != nil {
		return false, false, err
	}
	return true, true, nil
}

// endDeferral moves a deferred event to status (exhausted or cancelled)
// with its retry row. Events in any other status are left alone: an
// admitted event stays admitted.
func (s *Service) endDeferral(ctx context.Context, tx pgx.Tx, id string, status ingressstore.Status, lastError string, md map[string]any) (source string, applied bool, err error) {
	ev, err := ingressstore.LockEvent(ctx, tx, id)
	if errors.Is(err, pgdb.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	changed, err := ingressstore.SetEventStatus(ctx, tx, id, status, ingressstore.StatusDeferred)
	if err != nil || !changed {
		return ev.Source, false, err
	}
	state := ingressstore.RetryExhausted
	if status == ingressstore.StatusCancelled {
		state = ingressstore.RetryCancelled
	}
	if _, err := ingressstore.ResolveRetry(ctx, tx, id, state, lastError); err != nil {
		return ev.Source, false, err
	}
	if md != nil {
		if err := ingressstore.MergeRetryMetadata(ctx, tx, id, md); err != nil {
			return ev.Source, false, err
		}
	}
	return ev.Source, true, nil
}
