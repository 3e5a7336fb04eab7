package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/durable"
	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/lifecyclemsg"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
	"github.com/retryd/retryd/stores/pgtext"
)

// errSkipDue rolls back a due's transaction that must change nothing and
// must not be remembered as applied.
var errSkipDue = errors.New("due for a resolved delivery")

// throttleWait rolls a due back: its delivery waits in place, at the head
// of the throttle line, until the window has room.
type throttleWait struct{ until, now time.Time }

func (w *throttleWait) Error() string {
	return "throttle window full until " + w.until.Format(time.RFC3339Nano)
}

// handleDue retries a held delivery (retry.event-trigger.due.<id>):
// decode, apply in one transaction (applyDue), then act on the outcome
// (finishDue).
func (s *Service) handleDue(ctx context.Context, msg jetstream.Msg) error {
	due, inboxID, err := decodeTriggerDue(msg)
	if err != nil {
		return err
	}
	first, err := triggerstore.GetDelivery(ctx, s.cfg.Pool, due.ID)
	if errors.Is(err, pgdb.ErrNotFound) {
		return s.cancelUnknown(ctx, inboxID, due)
	}
	if err != nil {
		return err
	}
	var res result
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = s.applyDue(ctx, tx, inboxID, first.TriggerID, due)
		return err
	})
	return s.finishDue(ctx, due, first.TriggerID, res, err)
}

// decodeTriggerDue validates a message of retry.event-trigger.due.<id>
// and returns its due and the id its inbox row takes.
func decodeTriggerDue(msg jetstream.Msg) (contract.DueData, string, error) {
	ev, err := lifecyclemsg.Decode(msg, contract.KindEventTrigger, contract.Due)
	if err != nil {
		return contract.DueData{}, "", err
	}
	return *ev.Due, lifecyclemsg.InboxID(msg, ev.Envelope), nil
}

// applyDue applies a due inside tx: claim it, lock the trigger and the
// delivery (in that order, as everywhere), drop replays, answer for a
// delivery launched already, and otherwise decide again (redecide). It
// returns errSkipDue or a *throttleWait to roll back without a trace.
func (s *Service) applyDue(ctx context.Context, tx pgx.Tx, inboxID, triggerID string, due contract.DueData) (result, error) {
	res := result{attempt: due.Attempt}
	claimed, err := inbox.Claim(ctx, tx, ConsumerRetry, inboxID)
	if err != nil || !claimed {
		res.duplicate = !claimed
		return res, err
	}
	t, err := triggerstore.LockTrigger(ctx, tx, triggerID)
	missing := errors.Is(err, pgdb.ErrNotFound)
	if err != nil && !missing {
		return res, err
	}
	d, err := triggerstore.LockDelivery(ctx, tx, due.ID)
	if err != nil {
		return res, err
	}
	now, err := triggerstore.Now(ctx, tx)
	if err != nil {
		return res, err
	}
	switch {
	case due.Attempt <= d.RetryAttempts:
		// An attempt already handled (a replay older than the inbox).
		res.duplicate = true
		return res, nil
	case d.Status == triggerstore.StatusLaunched:
		res.duplicate = true
		return res, s.answerLaunched(ctx, tx, d, due.Attempt, now)
	case !d.Status.Held() && d.ScheduledAttempt < due.Attempt:
		// Cancelled, exhausted or filtered, and no retry of it was
		// confirmed: a due emitted before an operator's cancel. Roll
		// back the claim so that, if this is a manual retry whose
		// rescheduled event is still on its way, the scheduler's
		// re-emission of the due is applied.
		return res, errSkipDue
	}
	run, msgs, o, err := s.redecide(ctx, tx, t, missing, &d, due, now)
	if err != nil {
		return res, err
	}
	if err := triggerstore.SaveOutcome(ctx, tx, d); err != nil {
		return res, err
	}
	if err := s.keepHeld(ctx, tx, d, o); err != nil {
		return res, err
	}
	if err := s.write(ctx, tx, run, msgs); err != nil {
		return res, err
	}
	res.delivery = d
	return res, s.cfg.failpoint.At(ctx, failpointRetryBeforeCommit)
}

// answerLaunched tells the scheduler again that delivery d launched, so
// the item resolves even if it was retried by hand after the launch.
func (s *Service) answerLaunched(ctx context.Context, tx pgx.Tx, d triggerstore.Delivery, attempt int, now time.Time) error {
	ok, err := contract.NewLifecycleMsg(EventSource, contract.Succeeded, contract.SucceededData{
		Kind: contract.KindEventTrigger, ID: d.ID, Attempt: attempt,
		Metadata: map[string]string{"trigger_id": d.TriggerID, "run_id": d.RunID},
	}, now)
	if err != nil {
		return err
	}
	return s.write(ctx, tx, nil, []*nats.Msg{ok})
}

// redecide decides a held delivery again, as on its first offer: cancel
// it when its trigger is gone or disabled or its event is missing,
// otherwise launch, hold again or filter. It updates d and returns the
// run to launch (if any), the messages to write and the offer. A throttle
// line that is not yet at d's turn returns a *throttleWait.
func (s *Service) redecide(ctx context.Context, tx pgx.Tx, t triggerstore.Trigger, missing bool, d *triggerstore.Delivery,
	due contract.DueData, now time.Time) (*triggerstore.Run, []*nats.Msg, offer, error) {
	var o offer
	reason := ""
	switch {
	case missing || t.Deleted():
		reason = ReasonTriggerDeleted
	case !t.Enabled:
		reason = ReasonTriggerDisabled
	}
	if reason == "" {
		env, found, err := s.rehydrate(ctx, tx, *d, due.Payload)
		if err != nil {
			return nil, nil, o, err
		}
		if !found {
			reason = ReasonEventMissing
		} else if o, err = newOffer(env); err != nil {
			return nil, nil, o, err
		}
	}
	if reason != "" {
		if !missing {
			d.TriggerVersion = t.Version
		}
		msgs, err := cancelRetry(d, triggerstore.StatusCancelled, reason, due.Attempt, now)
		return nil, msgs, o, err
	}
	dec, err := s.decide(ctx, tx, t, o, d.ID, now, false)
	if err != nil {
		return nil, nil, o, err
	}
	if !dec.waitUntil.IsZero() {
		// Rolled back, claim included: the same due comes back.
		return nil, nil, o, &throttleWait{until: dec.waitUntil, now: now}
	}
	run, msgs, err := settle(d, t, o, dec, due.Attempt, now)
	return run, msgs, o, err
}

// finishDue acts on what applyDue did, after its transaction: hand a due
// waiting for its throttle turn back, drop one for a resolved delivery,
// and report the rest.
func (s *Service) finishDue(ctx context.Context, due contract.DueData, triggerID string, res result, err error) error {
	if w, ok := errors.AsType[*throttleWait](err); ok {
		s.metrics.throttleWaits.WithLabelValues(triggerID).Inc()
		return durable.NakAfter(max(w.until.Sub(w.now), time.Millisecond))
	}
	if errors.Is(err, errSkipDue) {
		s.log.Info().Str("delivery_id", due.ID).Int("attempt", due.Attempt).Msg("due for a resolved delivery ignored")
		s.metrics.duplicates.WithLabelValues(ConsumerRetry).Inc()
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.cfg.failpoint.At(ctx, failpointRetryAfterCommit); err != nil {
		return err
	}
	if res.duplicate {
		s.kick()
	}
	s.report(ConsumerRetry, res)
	return nil
}

// rehydrate finds the delivery's event: in the due's payload (put there
// by the held event), else in trigger_events, where triggers kept it when
// it held the delivery.
func (s *Service) rehydrate(ctx context.Context, tx pgx.Tx, d triggerstore.Delivery, payload json.RawMessage) (contract.Envelope, bool, error) {
	if len(payload) > 0 {
		var p retryPayload
		if err := json.Unmarshal(payload, &p); err == nil && len(p.Event) > 0 {
			env, err := contract.DecodeEventMsg(p.Event)
			if err == nil && env.ID == d.EventID {
				return env, true, nil
			}
		}
		s.log.Warn().Str("delivery_id", d.ID).Msg("due payload holds no usable event; reading trigger_events")
	}
	stored, err := triggerstore.GetEvent(ctx, tx, d.EventID)
	if errors.Is(err, pgdb.ErrNotFound) {
		return contract.Envelope{}, false, nil
	}
	if err != nil {
		return contract.Envelope{}, false, err
	}
	env, err := contract.DecodeEventMsg(stored)
	if err != nil {
		s.log.Error().Err(err).Str("event_id", d.EventID).Msg("stored event envelope is invalid")
		return contract.Envelope{}, false, nil
	}
	return env, true, nil
}

// cancelUnknown answers a due for a delivery this database does not know
// (restored from an older backup, or published by hand) with a cancelled
// event, so the scheduler does not keep it pending forever.
func (s *Service) cancelUnknown(ctx context.Context, inboxID string, due contract.DueData) error {
	applied := false
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		claimed, err := inbox.Claim(ctx, tx, ConsumerRetry, inboxID)
		if err != nil || !claimed {
			return err
		}
		now, err := triggerstore.Now(ctx, tx)
		if err != nil {
			return err
		}
		msg, err := contract.NewLifecycleMsg(EventSource, contract.Cancelled, contract.CancelledData{
			Kind: contract.KindEventTrigger, ID: due.ID, Attempt: due.Attempt, By: cancelledBy, Reason: ReasonDeliveryMissing,
		}, now)
		if err != nil {
			return err
		}
		applied = true
		return outbox.Insert(ctx, tx, OutboxOwner, msg)
	})
	if err != nil {
		return err
	}
	if applied {
		s.kick()
		s.log.Error().Str("delivery_id", due.ID).Int("attempt", due.Attempt).Msg("due for an unknown delivery; cancelled")
		s.metrics.cancelled.WithLabelValues("", ReasonDeliveryMissing).Inc()
	}
	return nil
}

// handleRetryState keeps a delivery's retry columns in step with the
// scheduler: scheduled/rescheduled set next_attempt_at, exhausted and
// cancelled end the delivery.
func (s *Service) handleRetryState(ctx context.Context, msg jetstream.Msg) error {
	ev, err := lifecyclemsg.Decode(msg, contract.KindEventTrigger)
	if err != nil {
		return err
	}
	var (
		applied   bool
		duplicate bool
		d         triggerstore.Delivery
	)
	err = pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		applied, duplicate = false, false
		claimed, err := inbox.Claim(ctx, tx, ConsumerRetryState, lifecyclemsg.InboxID(msg, ev.Envelope))
		if err != nil {
			return err
		}
		if !claimed {
			duplicate = true
			return nil
		}
		switch {
		case ev.Scheduled != nil:
			sd := ev.Scheduled
			manual := sd.Decision.DecidedBy == contract.DecidedByManual
			applied, err = triggerstore.ApplyScheduled(ctx, tx, ev.ID, sd.Attempt, sd.NextAttemptAt, manual, map[string]any{
				"policy": sd.Decision.Policy, "policy_version": sd.Decision.PolicyVersion,
				"decided_by": sd.Decision.DecidedBy, "delay_ms": sd.Decision.DelayMS,
				"retry_count": sd.Decision.RetryCount, "max_retries": sd.Decision.MaxRetries,
			})
		case ev.Exhausted != nil:
			x := ev.Exhausted
			d, applied, err = triggerstore.ApplyExhausted(ctx, tx, ev.ID, x.Attempt, x.Reason, map[string]any{
				"exhausted_reason": x.Reason, "policy": x.Policy, "policy_version": x.PolicyVersion,
				"retry_count": x.RetryCount, "max_retries": x.MaxRetries,
			})
		case ev.Cancelled != nil:
			c := ev.Cancelled
			d, applied, err = triggerstore.ApplyCancelled(ctx, tx, ev.ID, c.Attempt, "cancelled_by_"+pgtext.Truncate(c.By, 32), map[string]any{
				"cancelled_by": c.By, "cancel_reason": pgtext.Truncate(c.Reason, 256),
			})
		default:
			return invalidField("subject", fmt.Sprintf("%q is not scheduled, rescheduled, exhausted or cancelled", msg.Subject()))
		}
		if errors.Is(err, pgdb.ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	if duplicate || !applied {
		// Already applied, or superseded by what the delivery knows (a
		// replay, a stale attempt, a delivery launched meanwhile).
		s.metrics.duplicates.WithLabelValues(ConsumerRetryState).Inc()
		return nil
	}
	log := s.log.Debug().Str("delivery_id", ev.ID).Str("event", string(ev.Event)).Int("attempt", ev.Attempt()).Bool("applied", applied)
	switch {
	case ev.Exhausted != nil && applied:
		s.metrics.exhausted.WithLabelValues(d.TriggerID).Inc()
		log = s.log.Warn().Str("delivery_id", ev.ID).Str("trigger_id", d.TriggerID).Int("attempt", ev.Attempt()).Str("reason", ev.Exhausted.Reason)
	case ev.Cancelled != nil && applied:
		s.metrics.cancelled.WithLabelValues(d.TriggerID, "cancelled_by_scheduler").Inc()
		log = s.log.Info().Str("delivery_id", ev.ID).Str("trigger_id", d.TriggerID).Int("attempt", ev.Attempt()).Str("by", pgtext.Truncate(ev.Cancelled.By, 64))
	}
	log.Msg("retry state")
	return nil
}
