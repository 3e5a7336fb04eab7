package triggers

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/retryd/retryd/internal/inbox"
	"github.com/retryd/retryd/internal/outbox"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/services/triggers/internal/triggerstore"
	"github.com/retryd/retryd/stores/pgdb"
)

// result is what one transaction did, reported after the commit (metrics
// and logs never count work that rolled back).
type result struct {
	duplicate bool
	skipped   bool
	delivery  triggerstore.Delivery
	attempt   int
}

// handleEvent offers an admitted event (events.<source>.<type>) to every
// enabled trigger of its source and type, one transaction per trigger.
func (s *Service) handleEvent(ctx context.Context, msg jetstream.Msg) error {
	env, err := contract.DecodeEventMsg(msg.Data())
	if err != nil {
		return err
	}
	source, typ, err := contract.ParseEventSubject(msg.Subject())
	if err != nil {
		return err
	}
	if source != contract.SourceKey(env.Source) || typ != env.Type {
		return invalidField("subject", fmt.Sprintf("%q does not match the event's source %q and type %q", msg.Subject(), env.Source, env.Type))
	}
	ids, err := triggerstore.MatchingTriggerIDs(ctx, s.cfg.Pool, source, typ)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	o, err := newOffer(env)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := s.deliver(ctx, o, id); err != nil {
			return fmt.Errorf("deliver event %s to trigger %s: %w", env.ID, id, err)
		}
	}
	return nil
}

// deliver records the delivery of an event to one trigger and what came
// of it, with its run or failed event in the outbox, in one transaction.
// The inbox claim and the delivery's primary key make a redelivered event
// change nothing.
func (s *Service) deliver(ctx context.Context, o offer, triggerID string) error {
	var res result
	err := pgx.BeginFunc(ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		res = result{attempt: 1}
		claimed, err := inbox.Claim(ctx, tx, ConsumerEvents, o.env.ID+":"+triggerID)
		if err != nil {
			return err
		}
		if !claimed {
			res.duplicate = true
			return nil
		}
		t, err := triggerstore.LockTrigger(ctx, tx, triggerID)
		if errors.Is(err, pgdb.ErrNotFound) {
			res.skipped = true
			return nil
		}
		if err != nil {
			return err
		}
		if t.Deleted() || !t.Enabled {
			// Changed since the match: the event arrived after the change.
			res.skipped = true
			return nil
		}
		id := DeliveryID(o.env.ID, t.ID)
		if _, err := triggerstore.GetDelivery(ctx, tx, id); err == nil {
			res.duplicate = true
			return nil
		} else if !errors.Is(err, pgdb.ErrNotFound) {
			return err
		}
		now, err := triggerstore.Now(ctx, tx)
		if err != nil {
			return err
		}
		dec, err := s.decide(ctx, tx, t, o, id, now, true)
		if err != nil {
			return err
		}
		d := triggerstore.Delivery{ID: id, TriggerID: t.ID, EventID: o.env.ID, Source: o.env.Source, EventType: o.env.Type}
		run, msgs, err := settle(&d, t, o, dec, 1, now)
		if err != nil {
			return err
		}
		inserted, err := triggerstore.InsertDelivery(ctx, tx, d)
		if err != nil {
			return err
		}
		if !inserted {
			res.duplicate = true
			return nil
		}
		if err := s.keepHeld(ctx, tx, d, o); err != nil {
			return err
		}
		if err := s.write(ctx, tx, run, msgs); err != nil {
			return err
		}
		res.delivery = d
		return s.cfg.failpoint.At(ctx, failpointDeliverBeforeCommit)
	})
	if err != nil {
		return err
	}
	if err := s.cfg.failpoint.At(ctx, failpointDeliverAfterCommit); err != nil {
		return err
	}
	s.report(ConsumerEvents, res)
	return nil
}

// keepHeld stores the event of a held delivery in triggers' own table, so
// its retry never needs ingress's.
func (s *Service) keepHeld(ctx context.Context, tx pgx.Tx, d triggerstore.Delivery, o offer) error {
	if !d.Status.Held() || len(o.full) == 0 {
		return nil
	}
	return triggerstore.KeepEvent(ctx, tx, d.EventID, o.full)
}

// write inserts the run (if any) and the outbox messages.
func (s *Service) write(ctx context.Context, tx pgx.Tx, run *triggerstore.Run, msgs []*nats.Msg) error {
	if run != nil {
		if run.LeaseExpiresAt == nil {
			lease := run.RequestedAt.Add(s.cfg.RunTimeout)
			run.LeaseExpiresAt = &lease
		}
		inserted, err := triggerstore.InsertRun(ctx, tx, *run)
		if err != nil {
			return err
		}
		if !inserted {
			// The unique keys say this delivery already has its run; never
			// request a second one.
			return fmt.Errorf("insert run %s: delivery %s already has a run", run.ID, run.DeliveryID)
		}
	}
	return outbox.Insert(ctx, tx, OutboxOwner, msgs...)
}

// report logs and counts a committed result and wakes the relay.
func (s *Service) report(consumer string, res result) {
	if res.duplicate {
		s.metrics.duplicates.WithLabelValues(consumer).Inc()
		return
	}
	if res.skipped {
		return
	}
	s.kick()
	d := res.delivery
	ev := s.log.Info().Str("delivery_id", d.ID).Str("trigger_id", d.TriggerID).Int("trigger_version", d.TriggerVersion).
		Str("event_id", d.EventID).Str("source", d.Source).Str("type", d.EventType).Int("attempt", res.attempt).
		Str("status", string(d.Status))
	if d.StatusReason != "" {
		ev = ev.Str("reason", d.StatusReason)
	}
	if d.RunID != "" {
		ev = ev.Str("run_id", d.RunID)
	}
	if d.NextAttemptAt != nil {
		ev = ev.Time("retry_after", *d.NextAttemptAt)
	}
	ev.Msg("delivery")

	retry := res.attempt > 1
	if retry {
		s.metrics.retried.WithLabelValues(d.TriggerID).Inc()
	}
	switch d.Status {
	case triggerstore.StatusLaunched:
		s.metrics.launched.WithLabelValues(d.TriggerID).Inc()
		if retry {
			s.metrics.retrySucceeded.WithLabelValues(d.TriggerID).Inc()
		}
	case triggerstore.StatusFiltered:
		s.metrics.filtered.WithLabelValues(d.TriggerID, d.StatusReason).Inc()
	case triggerstore.StatusThrottled:
		s.metrics.throttled.WithLabelValues(d.TriggerID).Inc()
	case triggerstore.StatusConcurrencyLimited:
		s.metrics.concurrencyLimited.WithLabelValues(d.TriggerID).Inc()
	case triggerstore.StatusCancelled:
		s.metrics.cancelled.WithLabelValues(d.TriggerID, d.StatusReason).Inc()
	}
}
